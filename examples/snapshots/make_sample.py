"""Make the sample PyTorch snapshots of this folder from a sample trace, with the standard library only.

    cargo build --release && python3 examples/snapshots/make_sample.py

1. sample_trace.jsonl: the first 3,000 operations of examples/traces/varying_sizes.jsonl and an
   empty_cache, with what was live then still live (a valid trace of its own).
2. `accalloc convert sample_trace.jsonl -o SNAPSHOT.json` replays it on a simulated device with the
   whole history recorded: the dict torch.cuda.memory._snapshot() returns, as JSON.
3. sample_snapshot.pickle: that dict as torch.cuda.memory._dump_snapshot writes it (pickle.dump,
   Python's default protocol), with a Python stack in every entry's frames, as PyTorch records them.
4. sample_snapshot_wrapped.pickle: the same with only the last 1,500 history entries, as PyTorch keeps
   when _record_memory_history(max_entries=1500) has wrapped.
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(ROOT, "target", "release", "accalloc")
FRAME = [{"filename": "train.py", "line": 42, "name": "forward"}]


def sample_trace(source, operations):
    lines = []
    with open(source) as f:
        for line in f:
            if len(lines) == operations:
                break
            lines.append(line.strip())
    lines.append('{"op":"empty_cache"}')
    return "\n".join(lines) + "\n"


def main():
    trace = os.path.join(HERE, "sample_trace.jsonl")
    with open(trace, "w") as f:
        f.write(sample_trace(os.path.join(ROOT, "examples", "traces", "varying_sizes.jsonl"), 3000))
    with tempfile.TemporaryDirectory() as tmp:
        snapshot_json = os.path.join(tmp, "snapshot.json")
        subprocess.run([TOOL, "convert", trace, "-o", snapshot_json], check=True)
        with open(snapshot_json) as f:
            snapshot = json.load(f)
    for segment in snapshot["segments"]:
        segment["segment_pool_id"] = tuple(segment["segment_pool_id"])
    for entries in snapshot["device_traces"]:
        for entry in entries:
            entry["frames"] = FRAME
    with open(os.path.join(HERE, "sample_snapshot.pickle"), "wb") as f:
        pickle.dump(snapshot, f)
    snapshot["device_traces"] = [entries[-1500:] for entries in snapshot["device_traces"]]
    with open(os.path.join(HERE, "sample_snapshot_wrapped.pickle"), "wb") as f:
        pickle.dump(snapshot, f)
    for name in ("sample_trace.jsonl", "sample_snapshot.pickle", "sample_snapshot_wrapped.pickle"):
        print(f"{name}: {os.path.getsize(os.path.join(HERE, name))} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
