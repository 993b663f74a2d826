"""Record real models' allocation traces on the host accelerator, with ACCALLOC_TRACE.

    python benchmarks/record_traces.py [--out DIR] [--only NAME ...]   (the Python with torch and accalloc)

Each workload of WORKLOADS runs in a process of its own (ACCALLOC_TRACE is read when accalloc starts)
and writes DIR/NAME.jsonl (default: examples/traces/real): every malloc and free the model made on the
device, its weights, AdamW's states, the activations and the CPU kernels' scratch, in order. Training
workloads change batch size and sequence length between steps, as a data loader with padded batches
does, or keep them fixed (the _fixed ones); the generation workload decodes with a KV cache that grows
a token at a time.

The traces are committed (examples/traces/real/README.md says what each holds), so the benchmarks
that replay them need no PyTorch; this script is how they were made, and test_traces.py re-records a
short one to keep it working.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parents[1] / "examples" / "traces" / "real"

# name: (model, kind, [(batch, sequence), ...] one entry per step)
WORKLOADS = {
    "gpt2_train": ("gpt2", "train", [(8, 64), (8, 64), (4, 128), (8, 96), (2, 256), (8, 64)]),
    "bert_train": ("bert", "train", [(8, 64), (16, 32), (8, 128), (4, 200), (8, 64)]),
    "t5_train": ("t5", "train", [(8, 64), (4, 96), (8, 48), (2, 160)]),
    "llama_train": ("llama", "train", [(8, 64), (8, 64), (4, 128), (8, 80), (2, 256)]),
    "cnn_train": ("cnn", "train", [(32, 0), (32, 0), (8, 0), (64, 0), (32, 0)]),
    "llama_generate": ("llama", "generate", [(1, 16), (4, 24), (2, 48)]),
    # Fixed shapes, as a training loop with a fixed batch and sequence length runs: every step asks
    # for the same tensors in the same order (what planned placement learns, issue 33).
    "gpt2_train_fixed": ("gpt2", "train", [(8, 64)] * 6),
    "bert_train_fixed": ("bert", "train", [(8, 64)] * 5),
    "t5_train_fixed": ("t5", "train", [(8, 64)] * 4),
    "llama_train_fixed": ("llama", "train", [(8, 64)] * 5),
    "cnn_train_fixed": ("cnn", "train", [(32, 0)] * 5),
    # Bucketed shapes, as a data loader that groups sequences by length gives: a few shapes, each
    # step one of them, in no fixed order (what several plans serve, issue 33).
    "gpt2_train_buckets": ("gpt2", "train", [(8, 64), (4, 128), (8, 64), (8, 64), (2, 256), (4, 128),
                                             (8, 64), (2, 256), (4, 128), (4, 128), (8, 64), (2, 256)]),
}


def run_workload(name):
    """In this process: run workload `name` on the accalloc device (ACCALLOC_TRACE already set)."""
    import torch

    import accalloc.torch
    import model_zoo

    device = accalloc.torch.register_host_device()
    model_name, kind, shapes = WORKLOADS[name]
    torch.set_num_threads(1)  # one thread: the same trace on every machine
    model = model_zoo.build(model_name, device)
    if kind == "train":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for seed, (batch_size, sequence) in enumerate(shapes):
            inputs = model_zoo.batch(model_name, device, batch_size, sequence, seed=seed)
            loss = model_zoo.loss_of(model_name, model, inputs)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            del inputs, loss
    else:
        model.eval()
        for seed, (batch_size, prompt) in enumerate(shapes):
            ids = model_zoo.batch(model_name, device, batch_size, prompt, seed=seed)[0]
            with torch.no_grad():
                model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)
            del ids
    del model
    torch.accelerator.empty_cache()


def record(name, out_dir):
    """Run workload `name` in a child process that writes out_dir/name.jsonl; returns the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.jsonl"
    env = {**os.environ, "ACCALLOC_TRACE": str(path), "ACCALLOC_HOST_DEVICES": "1", "ACCALLOC_DEVICE": "host",
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    env.pop("ACCALLOC_CONF", None)
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run", name], env=env, check=True)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", choices=sorted(WORKLOADS))
    parser.add_argument("--run", help=argparse.SUPPRESS)  # the child process's side
    args = parser.parse_args()
    if args.run:
        run_workload(args.run)
        return
    for name in args.only or WORKLOADS:
        path = record(name, args.out)
        lines = sum(1 for _ in path.open())
        print(f"{path}: {lines} operations, {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
