"""PyTorch on accalloc's host accelerator against the same work on the CPU, as ratios in one run.

    ACCALLOC_HOST_DEVICES=1 python benchmarks/bench_torch.py [--quick]   (the Python with torch and accalloc)

Rows: torch.empty + free of a tensor on the accalloc device against a CPU tensor (PyTorch's CPU
allocator is the C library's malloc), for several sizes; one training step (forward, backward, AdamW)
of an MLP, a transformer block and the real models of model_zoo.py (GPT-2, BERT, T5, Llama from
transformers, a CNN with batch norm), and Llama's greedy generation with its KV cache.

The device runs the CPU's kernels over its own memory (no copies), so a step's ratio is what the
accelerator plumbing costs: dispatch to the device, the fallback's wrapping of each operator, and
accalloc in place of malloc. The device and the CPU take turns, round after round, and each figure is
the median of its rounds: a busy machine slows both alike.
"""
import statistics
import sys
import time

import torch

import accalloc.torch
import model_zoo

DEVICE = accalloc.torch.register_host_device()


def alternating_medians(functions, repeat, rounds, round_seconds):
    """{key: median seconds per call}, the functions taking turns, at least `repeat` calls a round and
    enough for a round to last about `round_seconds`."""
    times = {key: [] for key in functions}
    slowest = 0.0
    for function in functions.values():
        function()  # warm: first-call costs (allocator growth, lazy initialisation) are not a round's
        start = time.perf_counter()
        function()
        slowest = max(slowest, time.perf_counter() - start)
    repeat = max(repeat, int(round_seconds / max(slowest, 1e-9)))
    for _ in range(rounds):
        for key, function in functions.items():
            start = time.perf_counter()
            for _ in range(repeat):
                function()
            times[key].append((time.perf_counter() - start) / repeat)
    return {key: statistics.median(values) for key, values in times.items()}


def empty_and_free(numel, device):
    def run():
        torch.empty(numel, dtype=torch.uint8, device=device)
    return run


def small_step(make, shape, device):
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


def generation(device, new_tokens=16):
    model = model_zoo.build("llama", device).eval()
    prompt = model_zoo.batch("llama", device, batch_size=2, sequence=16)[0]

    def run():
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return run


def rows(quick):
    for label, numel in (("torch.empty + free, 512 B", 512), ("torch.empty + free, 64 KiB", 64 << 10),
                         ("torch.empty + free, 4 MiB", 4 << 20)):
        yield label, {"device": empty_and_free(numel, DEVICE), "cpu": empty_and_free(numel, "cpu")}, \
            (500 if quick else 5000), 15
    step_rounds = 3 if quick else 9
    yield "training step, MLP 256-512-4, batch 64", \
        {"device": small_step(mlp, (64, 256), DEVICE), "cpu": small_step(mlp, (64, 256), "cpu")}, 5, step_rounds
    yield "training step, transformer block, 8 x 32 x 64", \
        {"device": small_step(Block, (8, 32, 64), DEVICE), "cpu": small_step(Block, (8, 32, 64), "cpu")}, 5, step_rounds
    for name, label, batch_size in (("gpt2", "GPT-2, 4 x 256", 8), ("bert", "BERT, 4 x 256", 8),
                                    ("t5", "T5, 4 + 4 x 256", 8), ("llama", "Llama, 4 x 256", 8),
                                    ("cnn", "CNN with batch norm", 8), ("cnn", "CNN with batch norm", 32)):
        shape = f"batch {batch_size} x 3 x 32 x 32" if name == "cnn" else f"batch {batch_size} x 64 tokens"
        trainers = {"device": model_zoo.trainer(name, DEVICE, batch_size),
                    "cpu": model_zoo.trainer(name, "cpu", batch_size)}
        yield f"training step, {label}, {shape}", trainers, 1, step_rounds
    yield "Llama generate, 2 x 16 prompt + 16 tokens (KV cache)", \
        {"device": generation(DEVICE), "cpu": generation("cpu")}, 1, step_rounds


def main():
    quick = "--quick" in sys.argv
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of alternating rounds")
    print("| what | accalloc device (us) | CPU (us) | device / CPU |")
    print("|---|---:|---:|---:|")
    for label, functions, repeat, rounds in rows(quick):
        medians = alternating_medians(functions, repeat, rounds, 0.05 if quick else 0.3)
        device_us, cpu_us = medians["device"] * 1e6, medians["cpu"] * 1e6
        print(f"| {label} | {device_us:.2f} | {cpu_us:.2f} | {device_us / cpu_us:.2f} |", flush=True)


if __name__ == "__main__":
    main()
