#!/usr/bin/env bash
# Regenerates examples/output/: the summary, the snapshot at peak and the memory timeline of the sample
# transformer trace, with and without expandable segments. Run from anywhere after `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=target/release/accalloc
trace=examples/traces/transformer_train.jsonl
out=examples/output
mkdir -p "$out"
"$tool" replay "$trace" --simulate --summary --svg "$out/transformer_timeline.svg" \
  --snapshot "$out/transformer_snapshot.json" > "$out/transformer_summary.txt"
echo "wrote $out/transformer_summary.txt, transformer_timeline.svg, transformer_snapshot.json"

# The trace whose sizes keep changing, without and with expandable segments (trimmed).
"$tool" replay examples/traces/varying_sizes.jsonl --simulate --svg "$out/varying_default.svg" > /dev/null
"$tool" replay examples/traces/varying_sizes.jsonl --simulate --config expandable_segments:True,expandable_trim:True \
  --svg "$out/varying_expandable.svg" > /dev/null
echo "wrote $out/varying_default.svg, varying_expandable.svg"

# The same trace under PyTorch's defaults and with expandable segments, in one picture.
"$tool" compare examples/traces/varying_sizes.jsonl --config "" --config expandable_segments:True \
  --svg "$out/varying_compare.svg" > "$out/varying_compare.txt"
echo "wrote $out/varying_compare.svg, varying_compare.txt"
