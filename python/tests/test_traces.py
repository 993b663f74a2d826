"""The real-workload traces (examples/traces/real) and the script that records them
(python/benchmarks/record_traces.py): every committed trace is whole (each allocation freed once, ids
never reused, one device), and the script, run again, records the CNN's trace with the committed one's
allocations and peak.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "examples" / "traces" / "real"
RECORDER = ROOT / "python" / "benchmarks" / "record_traces.py"
sys.path.insert(0, str(RECORDER.parent))
from record_traces import WORKLOADS  # noqa: E402


def summary(path):
    """(allocations, peak live requested bytes) of a trace, checking that it is whole."""
    live, total, peak, allocations, seen = {}, 0, 0, 0, set()
    for line in path.open():
        event = json.loads(line)
        if event["op"] == "alloc":
            assert event["id"] not in seen, f"{path.name}: id {event['id']} reused"
            assert event.get("device", 0) == 0
            seen.add(event["id"])
            live[event["id"]] = event["size"]
            allocations += 1
            total += event["size"]
            peak = max(peak, total)
        elif event["op"] == "free":
            size = live.pop(event["id"], None)
            assert size is not None, f"{path.name}: id {event['id']} freed twice or never made"
            total -= size
    assert live == {}, f"{path.name}: {len(live)} allocations never freed"
    return allocations, peak


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_committed_trace_is_whole(name):
    allocations, peak = summary(TRACES / f"{name}.jsonl")
    assert allocations > 500 and peak > 1 << 20


def test_the_recorder_records_the_committed_cnn_trace_again(tmp_path):
    subprocess.run([sys.executable, str(RECORDER), "--out", str(tmp_path), "--only", "cnn_train"], check=True,
                   capture_output=True, timeout=600)
    assert summary(tmp_path / "cnn_train.jsonl") == summary(TRACES / "cnn_train.jsonl")
