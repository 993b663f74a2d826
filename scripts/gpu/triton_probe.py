"""Does Triton compile a kernel in a process where accalloc is loaded, or is PyTorch's CUDA allocator?

On an H200 (docs/GPU.md), torch.compile's first Triton kernel failed to compile (make_llir, MLIR's
ConvertTritonGPUToLLVM) in processes that had called accalloc.torch.use_for_cuda(), and compiled in
one without accalloc. This compiles the same small kernel (a GELU, which calls libdevice's erf, as
Inductor's did) in three fresh processes, each with an empty Triton cache:

  plain        no accalloc
  loaded       accalloc.torch imported and its CUDA extension loaded, use_for_cuda not called
  use_for_cuda accalloc as PyTorch's CUDA allocator (needs a GPU; skipped without one)

and prints, for each, the target Triton compiled for, whether it compiled, and MLIR's own
diagnostics when it did not (MLIR_ENABLE_DIAGNOSTICS). Part of scripts/gpu-check.sh; runs without a
GPU too (for a fixed target, sm_90), which is how it is checked here.

    python scripts/gpu/triton_probe.py            all three, in child processes
    python scripts/gpu/triton_probe.py MODE       one, in this process (what the children run)
Exits non-zero when a mode that could run failed to compile where "plain" compiled."""
import os
import subprocess
import sys
import tempfile

MODES = ("plain", "loaded", "use_for_cuda")


def compile_once(mode):
    import torch

    if mode in ("loaded", "use_for_cuda"):
        import accalloc.torch

        if mode == "loaded":
            accalloc.torch._extension("_torch_cuda")
        else:
            accalloc.torch.use_for_cuda()
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def gelu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        x = tl.load(x_ptr + offsets, mask=inside)
        tl.store(y_ptr + offsets, x * 0.5 * (1 + libdevice.erf(x * 0.7071067811865476)), mask=inside)

    if torch.cuda.is_available():
        target = triton.runtime.driver.active.get_current_target()
    else:
        target = triton.backends.compiler.GPUTarget("cuda", 90, 32)
    source = triton.compiler.ASTSource(fn=gelu, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                                           "BLOCK": "constexpr"}, constexprs={"BLOCK": 1024})
    compiled = triton.compile(source, target=target)
    print(f"{mode}: compiled for {target}: {len(compiled.asm['llir'])} bytes of LLVM IR")


def run_children():
    import torch

    gpu = torch.cuda.is_available()
    results = {}
    for mode in MODES:
        if mode == "use_for_cuda" and not gpu:
            print(f"{mode}: skipped (no GPU: use_for_cuda needs one)")
            continue
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton-probe-"),
                   MLIR_ENABLE_DIAGNOSTICS="error,warnings,stacktraces", ACCALLOC_DEVICE="cuda" if gpu else "host")
        done = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True, env=env,
                              timeout=300)
        results[mode] = done.returncode == 0
        if done.returncode == 0:
            print(done.stdout.strip())
            continue
        said = [line for line in done.stderr.splitlines() if "error" in line.lower() or "Error" in line]
        print(f"{mode}: FAILED to compile (exit {done.returncode}); first error lines:")
        for line in said[:8]:
            print(f"    {line[:300]}")
    failed = [mode for mode, ok in results.items() if not ok]
    if failed and results.get("plain"):
        print(f"Triton compiles without accalloc but not with it: {failed}")
        return 1
    return 0 if not failed else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        if sys.argv[1] not in MODES:
            sys.exit(f"usage: {sys.argv[0]} [{'|'.join(MODES)}]")
        compile_once(sys.argv[1])
    else:
        sys.exit(run_children())
