#!/usr/bin/env python3
"""docs/PERFORMANCE.md's utilization and device-call tables, rebuilt from the committed traces.

    python3 scripts/research/perf_tables.py        (after cargo build --release)

For every trace (the real models' in examples/traces/real first, then the generated ones): peak
allocated / peak reserved and device calls under PyTorch's defaults, plain expandable segments and
expandable_trim at its default line (`accalloc replay --simulate`); then, from `accalloc tune
--frontier`, the fewest calls at which a trim line reaches utilization 0.95, and the idealised
allocator of scripts/research/trim_bound.py at 0.95 (line from the final peak, byte pages) beside it.
Standard library only.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRIM_BOUND = Path(__file__).resolve().with_name("trim_bound.py")
ACCALLOC = ROOT / "target" / "release" / "accalloc"
CONFIGS = ("", "expandable_segments:True", "expandable_segments:True,expandable_trim:True")


def traces():
    real = sorted((ROOT / "examples" / "traces" / "real").glob("*.jsonl"))
    generated = [ROOT / "examples" / "traces" / f"{n}.jsonl"
                 for n in ("varying_sizes", "transformer_train", "random_rmm")]
    return real + generated


def replay(trace, config):
    args = [str(ACCALLOC), "replay", str(trace), "--json", "--simulate"] + (["--config", config] if config else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    stats = json.loads(out.splitlines()[-1])["stats"]
    allocated, reserved = stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]
    return allocated / reserved, reserved, stats["num_device_alloc"] + stats["num_device_free"]


def frontier(trace):
    out = subprocess.run([str(ACCALLOC), "tune", str(trace), "--frontier", "--json"], capture_output=True, text=True,
                         check=True).stdout.splitlines()[-1]
    return json.loads(out)["points"]


def bound_at_095(trace):
    out = subprocess.run([sys.executable, str(TRIM_BOUND), str(trace)], capture_output=True, text=True,
                         check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("| 0.95 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    return float(cells[2]), int(re.match(r"[\d,]+", cells[3]).group().replace(",", ""))


def calls(point):
    """Device calls (allocations and frees) of a point of the frontier."""
    return point["device_allocs"] + point["device_frees"]


def name(trace):
    return ("real/" if trace.parent.name == "real" else "") + trace.stem


def main():
    if not ACCALLOC.exists():
        subprocess.run(["cargo", "build", "--release"], cwd=ROOT, check=True)
    print("| trace | defaults | expandable | expandable + trim | device calls (def / exp / trim) "
          "| trim's peak <= plain's |")
    print("|---|---:|---:|---:|---|:---:|")
    for trace in traces():
        rows = [replay(trace, c) for c in CONFIGS]
        print(f"| {name(trace)} | {rows[0][0]:.3f} | {rows[1][0]:.3f} | {rows[2][0]:.3f} | "
              f"{rows[0][2]} / {rows[1][2]} / {rows[2][2]} | {'yes' if rows[2][1] <= rows[1][1] else 'NO'} |")
    print()
    print("| trace | plain expandable | fewest calls for >= 0.95 (line) | / plain's "
          "| best trim line (utilization / calls) | idealised model at 0.95 (utilization / calls) |")
    print("|---|---:|---:|---:|---:|---:|")
    for trace in traces():
        points = frontier(trace)
        plain = points[1]
        plain_calls = max(plain["device_allocs"] + plain["device_frees"], 1)
        trims = points[2:]
        reaching = [p for p in trims if p["utilization"] >= 0.95]
        best = max(trims, key=lambda p: (round(p["utilization"], 3), -calls(p)))
        if reaching:
            pick = min(reaching, key=calls)
            reach = f"{calls(pick)} ({pick['trim_slack']})"
            ratio = f"{calls(pick) / plain_calls:.2f}"
        else:
            reach, ratio = "not reached", "-"
        bound_u, bound_calls = bound_at_095(trace)
        print(f"| {name(trace)} | {plain['utilization']:.3f} / {calls(plain)} | {reach} | {ratio} | "
              f"{best['utilization']:.3f} / {calls(best)} ({best['trim_slack']}) | {bound_u:.3f} / {bound_calls} |")


if __name__ == "__main__":
    main()
