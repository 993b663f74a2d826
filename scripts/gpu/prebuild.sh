#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh needs from Rust, for a GPU machine that has no Rust toolchain or no
# crate registry: libaccalloc.so, the accalloc tool and the CUDA test binaries (tests/cuda.rs,
# tests/cuda_capture.rs), with the commit they were built from, in one folder (default .gpu-prebuilt/,
# ignored by git). Then, on the GPU machine, with this checkout:
#   ACCALLOC_GPU_PREBUILT=.gpu-prebuilt scripts/gpu-check.sh
# The binaries need the GPU machine's glibc to be at least this machine's (`ldd --version`).
#
# Usage: scripts/gpu/prebuild.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu-prebuilt}
cargo build --release --quiet
# Where cargo builds (CARGO_TARGET_DIR or the workspace's target/).
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
test_binary() { # the executable of one integration test, built in release (cargo's errors shown)
  cargo test --release --test "$1" --no-run --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == sys.argv[1]:
        print(msg["executable"])' "$1"
}
tests=$(test_binary cuda) || { echo "prebuild: tests/cuda.rs did not build" >&2; exit 1; }
capture_tests=$(test_binary cuda_capture) || { echo "prebuild: tests/cuda_capture.rs did not build" >&2; exit 1; }
[ -n "$tests" ] && [ -n "$capture_tests" ] || { echo "prebuild: a CUDA test binary was not built" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
cp "$target/release/libaccalloc.so" "$target/release/accalloc" "$out/"
cp "$tests" "$out/cuda-tests"
cp "$capture_tests" "$out/cuda-capture-tests"
git rev-parse --short HEAD > "$out/commit"
if ! git diff --quiet HEAD 2>/dev/null; then sed -i 's/$/ (with uncommitted changes)/' "$out/commit"; fi
echo "prebuild: $(cat "$out/commit") in $out: $(ls "$out" | tr '\n' ' ')"
