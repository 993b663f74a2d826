"""The real-workload traces (examples/traces/real) and the script that records them
(python/benchmarks/record_traces.py): every committed trace is whole (each allocation freed once, ids
never reused, one device), and the script, run again, records the CNN's trace with the committed one's
allocations and peak.
"""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "examples" / "traces" / "real"
RECORDER = ROOT / "python" / "benchmarks" / "record_traces.py"
sys.path.insert(0, str(RECORDER.parent))
sys.path.insert(0, str(ROOT / "scripts"))
import trace_format  # noqa: E402
from record_traces import WORKLOADS  # noqa: E402


def summary(path):
    """(allocations, peak live requested bytes) of a trace, read with the scripts' one reader (which
    refuses a reused id or a free of an id not live), checking that it is whole and on one device."""
    live, total, peak, allocations = {}, 0, 0, 0
    for op in trace_format.iter_trace(path):
        if op.op == "alloc":
            assert op.device == 0
            live[op.id] = op.size
            allocations += 1
            total += op.size
            peak = max(peak, total)
        elif op.op == "free":
            total -= live.pop(op.id)
    assert live == {}, f"{path.name}: {len(live)} allocations never freed"
    return allocations, peak


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_committed_trace_is_whole(name):
    allocations, peak = summary(TRACES / f"{name}.jsonl")
    assert allocations > 500 and peak > 1 << 20


def test_the_recorder_records_the_committed_cnn_trace_again(tmp_path):
    recorded = subprocess.run([sys.executable, str(RECORDER), "--out", str(tmp_path), "--only", "cnn_train"],
                              capture_output=True, text=True, errors="replace", timeout=600)
    # A failed recording says why (its child's traceback is on the recorder's stderr).
    assert recorded.returncode == 0, f"the recorder failed ({recorded.returncode}):\n{recorded.stderr[-6000:]}"
    assert summary(tmp_path / "cnn_train.jsonl") == summary(TRACES / "cnn_train.jsonl")


# ---- the scripts' reader and writer (scripts/trace_format.py) against the Rust ones ------------------

TOOL = ROOT / "target" / "release" / "accalloc"
needs_tool = pytest.mark.skipif(not TOOL.exists(), reason=f"{TOOL} is not built (cargo build --release)")
COMMITTED = sorted(ROOT.glob("examples/traces/*.jsonl")) + sorted(TRACES.glob("*.jsonl"))


@needs_tool
@pytest.mark.parametrize("path", COMMITTED[:3] + COMMITTED[-2:], ids=lambda p: p.name)
def test_the_python_writer_writes_the_rust_writers_bytes(path, tmp_path):
    # `accalloc convert` reads a trace with the Rust reader and writes it with the Rust writer.
    rust = tmp_path / "rust.jsonl"
    subprocess.run([str(TOOL), "convert", str(path), "-o", str(rust)], check=True, capture_output=True)
    python = tmp_path / "python.jsonl"
    trace_format.write_trace(python, trace_format.read_trace(path))
    assert python.read_bytes() == rust.read_bytes()


POOL_TRACE = (
    '{"op":"pool_create","pool":[0,1],"use_on_oom":true,"no_split":false}\n'
    '{"op":"pool_begin","pool":[0,1]}\n{"op":"alloc","id":1,"size":1000,"stream":0}\n'
    '{"op":"pool_begin","pool":[2,0],"stream":3,"device":0}\n{"op":"pool_end","pool":[2,0]}\n'
    '{"op":"pool_end","pool":[0,1]}\n{"op":"free","id":1}\n{"op":"pool_release","pool":[0,1]}\n'
    '{"op":"pool_empty","pool":[0,1],"live":true}\n{"op":"pool_empty","pool":[0,1]}\n'
)


@needs_tool
def test_pool_ops_read_and_write_as_in_rust(tmp_path):
    path = tmp_path / "pools.jsonl"
    path.write_text(POOL_TRACE)
    rust = tmp_path / "rust.jsonl"
    subprocess.run([str(TOOL), "convert", str(path), "-o", str(rust)], check=True, capture_output=True)
    python = tmp_path / "python.jsonl"
    trace_format.write_trace(python, trace_format.read_trace(path))
    assert python.read_bytes() == rust.read_bytes()
    # Defaults written out, device 0 left out, as the Rust writer does.
    assert '{"op":"pool_empty","pool":[0,1],"live":false}' in python.read_text()
    assert '"device":0' not in python.read_text()


BAD_TRACES = {
    "pool_without_pair": '{"op":"pool_end","pool":[1]}\n',
    "pool_default_id": '{"op":"pool_release","pool":[0,0]}\n',
    "pool_flag_not_bool": '{"op":"pool_create","pool":[0,1],"no_split":1}\n',
    "pool_device_too_high": '{"op":"pool_begin","pool":[0,1],"device":5000}\n',
    "not_json": '{"op":"alloc","id":1,"size":8}\nnot json\n',
    "missing_size": '{"op":"alloc","id":1}\n',
    "negative_size": '{"op":"alloc","id":1,"size":-3}\n',
    "fractional_id": '{"op":"free","id":1.5}\n',
    "unknown_op": '{"op":"resize"}\n',
    "not_an_object": "[1,2]\n",
    "missing_op": '{"op":"empty_cache"}\n{"id":1}\n',
    "device_too_high": '{"op":"alloc","id":1,"size":8,"device":1024}\n',
    "id_reused": '{"op":"alloc","id":1,"size":8}\n\n{"op":"alloc","id":1,"size":8}\n',
    "free_not_live": '{"op":"alloc","id":1,"size":8}\n{"op":"free","id":2}\n',
    "record_stream_not_live": '{"op":"record_stream","id":3,"stream":1}\n',
    "record_stream_without_stream": '{"op":"alloc","id":3,"size":8}\n{"op":"record_stream","id":3}\n',
}


@needs_tool
@pytest.mark.parametrize("name", sorted(BAD_TRACES))
def test_the_python_reader_refuses_what_the_rust_reader_refuses_naming_the_line(name, tmp_path):
    path = tmp_path / f"{name}.jsonl"
    path.write_text(BAD_TRACES[name])
    done = subprocess.run([str(TOOL), "replay", str(path), "--simulate"], capture_output=True, text=True)
    assert done.returncode != 0
    with pytest.raises(ValueError) as refused:
        trace_format.read_trace(path)
    why = str(refused.value)
    assert why.startswith("trace line ")
    # The same line number and reason; "not JSON" quotes each parser's own words after it.
    assert why.split(" (")[0].split(": {")[0] in done.stderr, (why, done.stderr)
