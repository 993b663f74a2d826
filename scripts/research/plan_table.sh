#!/bin/sh
# planned_placement beside plain expandable segments and the default trim line, on every committed
# trace: utilization (peak allocated / peak reserved) and device calls (maps + unmaps), on a
# simulated device. Rebuilds the table in docs/PERFORMANCE.md ("Planned placement, online").
# Run from the repository root after `cargo build --release -p accalloc-tools`.
set -e
tool=./target/release/accalloc
echo "| trace | plain expandable | expandable_trim (default line) | planned_placement | planned calls / plain's |"
echo "|---|---:|---:|---:|---:|"
for t in examples/traces/real/*.jsonl examples/traces/*.jsonl; do
  cells=""
  for c in "expandable_segments:True" "expandable_segments:True,expandable_trim:True" "planned_placement:True"; do
    cells="$cells $($tool replay "$t" --simulate --json --config "$c" | python3 -c 'import json, sys
d = json.load(sys.stdin)
print("%.3f/%d" % (d["utilization"], d["device_allocs"] + d["device_frees"]))')"
  done
  echo "$(basename "$t" .jsonl) $cells" | python3 -c 'import sys
name, *cells = sys.stdin.read().split()
u = [c.split("/") for c in cells]
print("| %s | %s (%s calls) | %s (%s) | %s (%s) | %.2f |" % (name, u[0][0], u[0][1], u[1][0], u[1][1],
      u[2][0], u[2][1], int(u[2][1]) / max(1, int(u[0][1]))))'
done
