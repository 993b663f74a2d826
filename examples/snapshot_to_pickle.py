"""Turn accalloc's snapshot (accalloc_memory_snapshot_json, or `accalloc replay --snapshot FILE`) into the
pickle PyTorch's memory visualizer reads (the format of torch.cuda.memory._dump_snapshot), so the
segments, blocks and history can be explored at pytorch.org/memory_viz.

    python3 examples/snapshot_to_pickle.py snapshot.json snapshot.pickle
"""
import json
import pickle
import sys


def convert(snapshot):
    """accalloc's JSON has PyTorch's keys already; pickle wants tuples where PyTorch has them."""
    for segment in snapshot["segments"]:
        segment["segment_pool_id"] = tuple(segment.get("segment_pool_id", (0, 0)))
    return snapshot


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        snapshot = convert(json.load(f))
    with open(argv[2], "wb") as f:
        pickle.dump(snapshot, f)
    blocks = sum(len(s["blocks"]) for s in snapshot["segments"])
    entries = sum(len(t) for t in snapshot["device_traces"])
    print(f"{argv[2]}: {len(snapshot['segments'])} segments, {blocks} blocks, {entries} history entries")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
