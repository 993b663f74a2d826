"""One row of gpu-check.sh's planned-placement table: a trace replayed with planned_placement:True on
the GPU (accalloc replay --cuda) beside the same replay on the simulated device, whose figures
docs/PERFORMANCE.md gives. The plan, the peaks and the device calls must be the same on both: the
policy decides them, not the device.

    python scripts/gpu/planned_row.py TRACE ACCALLOC_TOOL
"""
import json
import subprocess
import sys
from pathlib import Path

trace, tool = sys.argv[1], sys.argv[2]


def replay(device):
    done = subprocess.run([tool, "replay", trace, device, "--json", "--config", "planned_placement:True"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


gpu, simulated = replay("--cuda"), replay("--simulate")
keys = ("peak_allocated_bytes", "peak_reserved_bytes", "device_allocs", "device_frees")
same = all(gpu[k] == simulated[k] for k in keys)
print(f"| {Path(trace).name} | {gpu['utilization']:.3f} | {gpu['device_allocs'] + gpu['device_frees']} | "
      f"{gpu['ns_per_op']:.0f} | {simulated['ns_per_op']:.0f} | {'yes' if same else 'NO'} |")
if not same:
    for k in keys:
        print(f"   {k}: gpu {gpu[k]} simulated {simulated[k]}")
    sys.exit(1)
