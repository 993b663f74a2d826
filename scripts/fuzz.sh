#!/usr/bin/env bash
# Fuzz the configuration parser, the trace and snapshot readers and hostile C API call sequences with cargo fuzz
# (libFuzzer + AddressSanitizer), each for SECONDS (default 20), starting from the committed corpus in
# fuzz/corpus. cargo fuzz needs nightly flags: RUSTC_BOOTSTRAP=1 lets the stable toolchain take them.
# Installs cargo-fuzz when missing. Exits non-zero on any crash (the input is left in fuzz/artifacts).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-${ACCALLOC_FUZZ_SECONDS:-20}}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
cargo fuzz build
for target in settings trace snapshot capi; do
  echo "== fuzz $target for ${seconds}s"
  # A scratch copy of the corpus, so a CI run leaves the committed one as it is.
  scratch=$(mktemp -d)
  cp -r "corpus/$target/." "$scratch/"
  log=$(mktemp)
  status=0
  cargo fuzz run "$target" "$scratch" -- -max_total_time="$seconds" > "$log" 2>&1 || status=$?
  grep -E "^(Done|==[0-9]+==ERROR|SUMMARY|thread .* panicked)" "$log" || true
  [ "$status" -eq 0 ] || tail -40 "$log"
  rm -rf "$scratch" "$log"
  [ "$status" -eq 0 ] || { echo "fuzz $target found a failure (see fuzz/artifacts/$target)"; exit 1; }
done
echo "fuzzing passed"
