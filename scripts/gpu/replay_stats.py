"""Replay a trace through PyTorch's caching allocator (torch.cuda.caching_allocator_alloc/_delete) and
through accalloc's CUDA backend (`accalloc replay --json --cuda`), and compare their memory_stats(): every
key both have must match in the default configuration. Prints the keys that differ (the first 20) and
each side's time per operation. Part of scripts/gpu-check.sh.

    python scripts/gpu/replay_stats.py TRACE ACCALLOC_TOOL
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for trace_format
import trace_format  # noqa: E402

trace, tool = sys.argv[1], sys.argv[2]
ops = trace_format.read_trace(trace)
if any(op.op == "record_stream" for op in ops):
    sys.exit(f"{trace}: record_stream has no counterpart in torch.cuda.caching_allocator_alloc's API")
torch.cuda.init()
torch.cuda.empty_cache()
torch.cuda.reset_accumulated_memory_stats()
torch.cuda.reset_peak_memory_stats()
streams = {0: torch.cuda.current_stream()}
live = {}
t = time.perf_counter()
for op in ops:
    if op.op == "alloc":
        if op.size == 0:
            continue
        stream = streams.setdefault(op.stream, torch.cuda.Stream())
        try:
            live[op.id] = torch.cuda.caching_allocator_alloc(op.size, stream=stream)
        except torch.cuda.OutOfMemoryError:
            pass
    elif op.op == "free":
        ptr = live.pop(op.id, None)
        if ptr is not None:
            torch.cuda.caching_allocator_delete(ptr)
    elif op.op == "empty_cache":
        torch.cuda.empty_cache()
torch_ns = (time.perf_counter() - t) * 1e9 / len(ops)
torch_stats = torch.cuda.memory_stats()
for ptr in live.values():
    torch.cuda.caching_allocator_delete(ptr)
replay = subprocess.run([tool, "replay", trace, "--json", "--cuda"], capture_output=True, text=True, check=True)
acc = json.loads(replay.stdout)
ours = acc["stats"]
keys = sorted(k for k in ours if k in torch_stats)
diff = [k for k in keys if ours[k] != torch_stats[k]]
print(f"{trace}: {len(keys)} keys compared, {len(diff)} differ; "
      f"ns/op pytorch {torch_ns:.0f}, accalloc {acc['ns_per_op']:.0f}")
for k in diff[:20]:
    print(f"   {k}: pytorch {torch_stats[k]} accalloc {ours[k]}")
