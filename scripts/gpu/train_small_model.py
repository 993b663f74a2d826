"""Train a small model on the GPU for 30 steps with varying batch sizes and print its peak reserved and
allocated memory and its median step time: with PyTorch's own CUDA allocator, or with accalloc as that
allocator (accalloc.torch.use_for_cuda). Part of scripts/gpu-check.sh.

    python scripts/gpu/train_small_model.py pytorch|accalloc
"""
import sys
import time

import torch

which = sys.argv[1]
if which not in ("pytorch", "accalloc"):
    sys.exit(f"usage: {sys.argv[0]} pytorch|accalloc (got {which!r})")
if which == "accalloc":
    import accalloc
    import accalloc.torch

    accalloc.torch.use_for_cuda()
torch.manual_seed(0)
layers = []
for _ in range(8):
    layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(2048, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
times = []
for step in range(30):
    batch = 64 + 32 * (step % 5)  # varying batch sizes
    x = torch.randn(batch, 2048, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
step_ms = 1000 * sorted(times[5:])[len(times[5:]) // 2]
# With use_for_cuda, torch.cuda's figures are accalloc's: the same calls serve both.
peak = torch.cuda.max_memory_reserved()
allocated = torch.cuda.max_memory_allocated()
if which == "accalloc":
    assert torch.cuda.memory_stats() == accalloc.memory_stats("cuda:0")
print(f"{which:9s} peak reserved {peak/2**20:9.1f} MiB  peak allocated {allocated/2**20:9.1f} MiB  "
      f"median step {step_ms:.2f} ms")
