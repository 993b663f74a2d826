#!/usr/bin/env bash
# Every test of accalloc: formatting, lints, the Rust tests (including the header check), the release
# build, then the C, C++, dlopen and Python ctypes tests under ctest, and a replay of the sample trace.
# Usage: scripts/test-all.sh            (from anywhere; needs cargo, a C/C++ compiler, cmake, python3)
#        ACCALLOC_ASAN=ON scripts/test-all.sh   also builds and runs the C tests under AddressSanitizer
#        ACCALLOC_VALGRIND=ON ...              also runs the C tests under valgrind
#        ACCALLOC_FUZZ_SECONDS=20 ...          also fuzzes each target that long (scripts/fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets -- -D warnings
echo "== cargo test"
cargo test
echo "== cargo build --release"
cargo build --release
# The SONAME is libaccalloc.so.<ABI>: give the build tree the link programs load (install.sh makes
# the real ones under a prefix).
abi=$(sed -n 's/^#define ACCALLOC_ABI_VERSION \([0-9]*\)$/\1/p' include/accalloc.h)
ln -sf libaccalloc.so "target/release/libaccalloc.so.$abi"
echo "== include/accalloc.h is committed as generated"
git diff --exit-code -- include/accalloc.h || { echo "include/accalloc.h is stale: commit the regenerated header"; exit 1; }

run_ctest() {
  local build_dir=$1; shift
  cmake -S c_tests -B "$build_dir" -DACCALLOC_LIB_DIR="$PWD/target/release" -DACCALLOC_INCLUDE_DIR="$PWD/include" "$@"
  cmake --build "$build_dir" -j2
  ctest --test-dir "$build_dir" --output-on-failure
}
echo "== statistics against the independent model of PyTorch's allocator"
python3 scripts/check_model.py

echo "== ctest"
run_ctest build/c_tests -DACCALLOC_VALGRIND="${ACCALLOC_VALGRIND:-OFF}"
if [ "${ACCALLOC_ASAN:-OFF}" = "ON" ]; then
  echo "== ctest under AddressSanitizer"
  run_ctest build/c_tests_asan -DACCALLOC_ASAN=ON
fi

echo "== examples/quickstart.c"
mkdir -p build
cc -std=c99 -Wall -Wextra -pedantic -Werror -Iinclude examples/quickstart.c -Ltarget/release -laccalloc \
  -Wl,-rpath,"$PWD/target/release" -o build/quickstart
./build/quickstart
echo "== examples/framework_backend.cpp"
c++ -std=c++17 -Wall -Wextra -Werror -Iinclude examples/framework_backend.cpp -Ltarget/release -laccalloc \
  -Wl,-rpath,"$PWD/target/release" -o build/framework_backend
./build/framework_backend

echo "== examples/accalloc_torch.py (statistics through ctypes, on the host)"
ACCALLOC_DEVICE=host python3 examples/accalloc_torch.py

if [ -n "${ACCALLOC_FUZZ_SECONDS:-}" ]; then
  echo "== fuzzing (${ACCALLOC_FUZZ_SECONDS}s a target)"
  scripts/fuzz.sh "$ACCALLOC_FUZZ_SECONDS"
fi

echo "== examples/snapshot_to_pickle.py (a snapshot for PyTorch's memory visualizer)"
./target/release/accalloc replay examples/traces/varying_sizes.jsonl --simulate --snapshot build/snapshot.json > /dev/null
python3 examples/snapshot_to_pickle.py build/snapshot.json build/snapshot.pickle

echo "== replay of the sample trace"
./target/release/accalloc replay examples/traces/transformer_train.jsonl
echo "all tests passed"
