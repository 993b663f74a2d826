"""torch.compile(mode="reduce-overhead") with accalloc as PyTorch's CUDA allocator (use_for_cuda): does a
small model compile with Inductor's CUDA graph trees and give eager's outputs? CUDA graph trees
check a graph pool's live blocks and checkpoint its state (checkPoolLiveAllocations,
getCheckpointState, setCheckpointPoolState), which PyTorch's
pluggable-allocator interface refuses for every external allocator (docs/PYTHON.md): this script says
what happens on this machine rather than assuming it.

Prints one line: "works: ..." (exit 0), "refused: <PyTorch's error>" (exit 0: the known gap, still
reported), or "failed: ..." (exit 1: outputs differ or an error other than the known refusal).
    python scripts/gpu/compile_reduce_overhead.py [accalloc|pytorch]
accalloc (the default) runs it through use_for_cuda; pytorch through PyTorch's own allocator, to tell
the allocator's part from the machine's (Triton, the compiler). Part of scripts/gpu-check.sh. Needs a
GPU and Triton."""
import sys

import torch

KNOWN_REFUSAL = ("checkPoolLiveAllocations", "getCheckpointState", "setCheckpointPoolState")


def main(which):
    if which == "accalloc":
        import accalloc.torch

        accalloc.torch.use_for_cuda()
    elif which != "pytorch":
        sys.exit(f"usage: {sys.argv[0]} [accalloc|pytorch] (got {which!r})")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    try:
        for step in range(4):  # the trees record on the first calls and replay after
            x = torch.randn(32, 256, device="cuda")
            got = compiled(x).clone()
            torch.cuda.synchronize()
            want = model(x)
            if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                print(f"{which}: failed: step {step}: outputs differ from eager (max diff {(got - want).abs().max():.3g})")
                return 1
    except Exception as error:  # noqa: BLE001 - reported, then judged below
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if any(word in str(error) for word in KNOWN_REFUSAL):
            print(f"{which}: refused: {type(error).__name__}: {first_line[:300]}")
            return 0
        print(f"{which}: failed: {type(error).__name__}: {first_line[:300]}")
        return 1
    stats = torch.cuda.memory_stats()
    print(f"{which}: works: 4 steps with eager's outputs; allocated.peak {stats.get('allocated_bytes.all.peak')}, "
          f"reserved {torch.cuda.memory_reserved()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "accalloc"))
