#!/bin/sh
# planned_placement beside plain expandable segments and the default trim line, on every committed
# trace: utilization (peak allocated / peak reserved) and device calls (maps + unmaps), on a
# simulated device; then the same for the last quarter of each trace (peaks reset there: what a
# long run sees past its first steps). Rebuilds the tables in docs/PERFORMANCE.md ("Planned
# placement, online"). Run from the repository root: `sh scripts/research/plan_table.sh` (it builds the
# tool first).
# The whole-trace table ends with the bound: the best offline placement of the whole trace
# (`accalloc replay --plan`) in one reservation of 2 MiB pages, the floor over its pages; and the
# growth floor: the fewest map calls any allocator of 2 MiB pages makes if it keeps 0.99 (0.97)
# utilization wherever the trace could have stopped (the same command's "growth floor" line).
set -e
cargo build --release -q -p accalloc-tools
tool=./target/release/accalloc
configs="expandable_segments:True expandable_segments:True,expandable_trim:True planned_placement:True"
figures() { # trace, config, extra flags: utilization/calls
  $tool replay "$1" --simulate --json --config "$2" $3 | python3 -c 'import json, sys
d = json.load(sys.stdin)
print("%.3f/%d" % (d["utilization"], d["device_allocs"] + d["device_frees"]))'
}
bound() { # trace: floor / the offline placement rounded up to 2 MiB pages, and the growth floor
  $tool replay "$1" --simulate --plan | python3 -c 'import re, sys
text = sys.stdin.read()
m = re.search(r"floor [^(]*\((\d+)\); offline placement [^(]*\((\d+),", text)
g = re.search(r"stopped: (\d+) at 0.99, (\d+) at 0.97", text)
page = 2 << 20
print("%.3f" % (int(m.group(1)) / (-(-int(m.group(2)) // page) * page)) if m else "-",
      "%s/%s" % g.groups() if g else "-")'
}
row() { # name, then three utilization/calls cells, then the bound or nothing
  echo "$*" | python3 -c 'import sys
name, *cells = sys.stdin.read().split()
u = [c.split("/") for c in cells[:3]]
bound = " %s | %s |" % (cells[3], cells[4]) if len(cells) > 4 else ""
print("| %s | %s (%s calls) | %s (%s) | %s (%s) | %.2f |%s" % (name, u[0][0], u[0][1], u[1][0], u[1][1],
      u[2][0], u[2][1], int(u[2][1]) / max(1, int(u[0][1])), bound))'
}
for part in whole last_quarter; do
  echo
  echo "$part of each trace:"
  echo
  if [ $part = whole ]; then
    echo "| trace | plain expandable | expandable_trim (default line) | planned_placement | planned calls / plain's | offline bound, 2 MiB pages | growth floor, calls at 0.99 / 0.97 |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
  else
    echo "| trace | plain expandable | expandable_trim (default line) | planned_placement | planned calls / plain's |"
    echo "|---|---:|---:|---:|---:|"
  fi
  for t in examples/traces/real/*.jsonl examples/traces/*.jsonl; do
    flags=""
    if [ $part = last_quarter ]; then flags="--reset-peaks-at $(( $(wc -l < "$t") * 3 / 4 ))"; fi
    cells=""
    for c in $configs; do cells="$cells $(figures "$t" "$c" "$flags")"; done
    if [ $part = whole ]; then cells="$cells $(bound "$t")"; fi
    row "$(basename "$t" .jsonl)" $cells
  done
done
