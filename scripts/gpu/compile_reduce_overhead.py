"""torch.compile(mode="reduce-overhead") (Inductor's CUDA graph trees) with accalloc as PyTorch's CUDA
allocator (use_for_cuda), or with PyTorch's own for comparison. CUDA graph trees check a graph pool's
live blocks (checkPoolLiveAllocations), checkpoint it after each recording (getCheckpointState) and
put a checkpoint back when they record a new graph after replaying others (setCheckpointPoolState).

    python scripts/gpu/compile_reduce_overhead.py [accalloc|pytorch]

Two loops, each compared with eager PyTorch at every step:
  inference  a compiled model called 5 times under no_grad (record once, then replay);
  training   x -> f -> g -> loss -> backward for 3 steps, then x -> f -> h for 3 steps: f's forward
             replays, and h's graph is recorded after that replay, which puts a checkpoint back
             (the run counts the calls to setCheckpointPoolState and says so).
Prints one line per loop and "<which>: works" or "<which>: failed: ..."; exits non-zero on a failure.
Part of scripts/gpu-check.sh and python/tests/test_cuda.py. Needs a GPU and Triton."""
import os
import sys
import tempfile

# Empty caches of its own: a kernel another run compiled is compiled again (on the H200 a kernel that
# failed to compile under accalloc went through when PyTorch's run had cached it).
for _cache in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
    os.environ[_cache] = tempfile.mkdtemp(prefix="compile-reduce-overhead-")

import torch  # noqa: E402 - after the caches are chosen


def inference(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for step in range(5):
            x = torch.randn(32, 256, device=device)
            got = compiled(x).clone()
            want = model(x)
            if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                return f"inference step {step}: outputs differ from eager"
    return None


def training(device):
    torch.manual_seed(0)
    f = torch.nn.Linear(64, 64).to(device)
    g = torch.nn.Linear(64, 8).to(device)
    h = torch.nn.Linear(64, 8).to(device)
    cf, cg, ch = (torch.compile(m, mode="reduce-overhead") for m in (f, g, h))
    for step in range(6):
        second, compiled_second = (g, cg) if step < 3 else (h, ch)
        x = torch.randn(16, 64, device=device)
        for module in (f, second):
            module.zero_grad(set_to_none=True)
        out = compiled_second(cf(x))
        out.square().sum().backward()
        got = [p.grad.clone() for p in (*f.parameters(), *second.parameters())]
        got_out = out.detach().clone()
        for module in (f, second):
            module.zero_grad(set_to_none=True)
        want_out = second(f(x))
        want_out.square().sum().backward()
        want = [p.grad for p in (*f.parameters(), *second.parameters())]
        if not torch.allclose(got_out, want_out.detach(), atol=1e-4, rtol=1e-4):
            return f"training step {step}: outputs differ from eager"
        if not all(torch.allclose(a, b, atol=1e-3, rtol=1e-3) for a, b in zip(got, want)):
            return f"training step {step}: gradients differ from eager"
    return None


def main(which):
    if which == "accalloc":
        import accalloc.torch

        accalloc.torch.use_for_cuda()
    elif which != "pytorch":
        sys.exit(f"usage: {sys.argv[0]} [accalloc|pytorch] (got {which!r})")
    restores = [0]
    put_back = torch._C._cuda_setCheckpointPoolState

    def counted(*args, **kwargs):
        restores[0] += 1
        return put_back(*args, **kwargs)

    torch._C._cuda_setCheckpointPoolState = counted  # cudagraph_trees looks it up at each call
    for name, loop in (("inference", inference), ("training", training)):
        before = restores[0]
        try:
            failure = loop("cuda")
        except Exception as error:  # noqa: BLE001 - reported with the loop's name
            text = str(error).strip()
            failure = f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"
        torch.cuda.synchronize()
        if failure:
            print(f"{which}: {name}: failed: {failure}")
            return 1
        print(f"{which}: {name}: eager's outputs at every step; checkpoints put back: {restores[0] - before}")
    stats = torch.cuda.memory_stats()
    print(f"{which}: works (allocated now {stats.get('allocated_bytes.all.current')}, "
          f"peak {stats.get('allocated_bytes.all.peak')}, reserved {torch.cuda.memory_reserved()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "accalloc"))
