"""torch.compile(mode="reduce-overhead") with accalloc as PyTorch's CUDA allocator (use_for_cuda): does a
small model compile with Inductor's CUDA graph trees and give eager's outputs? CUDA graph trees
checkpoint a graph pool's state through getCheckpointState/setCheckpointPoolState, which PyTorch's
pluggable-allocator interface refuses for every external allocator (docs/PYTHON.md): this script says
what happens on this machine rather than assuming it.

Prints one line: "works: ..." (exit 0), "refused: <PyTorch's error>" (exit 0: the known gap, still
reported), or "failed: ..." (exit 1: outputs differ or an error other than the known refusal).
Part of scripts/gpu-check.sh. Needs a GPU and Triton."""
import sys

import torch

import accalloc.torch

KNOWN_REFUSAL = ("getCheckpointState", "setCheckpointPoolState", "checkpoint")


def main():
    accalloc.torch.use_for_cuda()
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
                print(f"failed: step {step}: outputs differ from eager (max diff {(got - want).abs().max():.3g})")
                return 1
    except Exception as error:  # noqa: BLE001 - reported, then judged below
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if any(word in str(error) for word in KNOWN_REFUSAL):
            print(f"refused: {type(error).__name__}: {first_line[:300]}")
            return 0
        print(f"failed: {type(error).__name__}: {first_line[:300]}")
        return 1
    stats = torch.cuda.memory_stats()
    print(f"works: 4 steps with eager's outputs; allocated.peak {stats.get('allocated_bytes.all.peak')}, "
          f"reserved {torch.cuda.memory_reserved()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
