"""PyTorch on accalloc's host accelerator against the same work on the CPU, as ratios in one run.

    ACCALLOC_HOST_DEVICES=1 python benchmarks/bench_torch.py     (the Python with torch and accalloc)

Rows: torch.empty + free of a tensor on the accalloc device against a CPU tensor (PyTorch's CPU
allocator is the C library's malloc), for several sizes; one training step (forward, backward, AdamW)
of an MLP and of a small transformer block on the device against the CPU. The device runs the CPU's
kernels through the fallback, so a training step's ratio shows what the accelerator plumbing costs
(dispatch, the fallback's copies), not the allocator alone. Median of repeated batches.
"""
import statistics
import sys
import time

import torch

import accalloc.torch

DEVICE = accalloc.torch.register_host_device()


def median_ns(function, repeat, batches=15):
    times = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(repeat):
            function()
        times.append((time.perf_counter_ns() - start) / repeat)
    return statistics.median(times)


def empty_and_free(numel, device):
    def run():
        torch.empty(numel, dtype=torch.uint8, device=device)
    return run


def training_step(make, shape, device):
    torch.manual_seed(0)
    model = make().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(*shape).to(device)
    y = torch.randint(0, 4, (shape[0],)).to(device)

    def run():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return run


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 4))


class Block(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(width, 4, batch_first=True)
        self.norm = torch.nn.LayerNorm(width)
        self.feed_forward = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                torch.nn.Linear(4 * width, width))
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x):
        x = x + self.attention(x, x, x, need_weights=False)[0]
        x = x + self.feed_forward(self.norm(x))
        return self.head(x.mean(dim=1))


def main():
    quick = "--quick" in sys.argv
    rows = []
    for label, numel in (("torch.empty + free, 512 B", 512), ("torch.empty + free, 64 KiB", 64 << 10),
                         ("torch.empty + free, 4 MiB", 4 << 20)):
        repeat = 500 if quick else 5000
        device_ns = median_ns(empty_and_free(numel, DEVICE), repeat)
        cpu_ns = median_ns(empty_and_free(numel, "cpu"), repeat)
        rows.append((label, device_ns / 1e3, cpu_ns / 1e3))
    for label, make, shape in (("training step, MLP 256-512-4, batch 64", mlp, (64, 256)),
                               ("training step, transformer block, 8 x 32 x 64", Block, (8, 32, 64))):
        repeat = 5 if quick else 20
        device_ns = median_ns(training_step(make, shape, DEVICE), repeat, batches=7)
        cpu_ns = median_ns(training_step(make, shape, "cpu"), repeat, batches=7)
        rows.append((label, device_ns / 1e3, cpu_ns / 1e3))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of batches, microseconds")
    print("| what | accalloc device (us) | CPU (us) | device / CPU |")
    print("|---|---:|---:|---:|")
    for label, device_us, cpu_us in rows:
        print(f"| {label} | {device_us:.2f} | {cpu_us:.2f} | {device_us / cpu_us:.2f} |")


if __name__ == "__main__":
    main()
