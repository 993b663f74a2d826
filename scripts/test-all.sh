#!/usr/bin/env bash
# Every test of accalloc: formatting, lints (clippy; ruff on the Python), the Rust tests (including the
# header check), the release build, then the C, C++, dlopen and Python ctypes tests under ctest, and a
# replay of the sample trace. The environments' default folders are set in scripts/lib/env.sh.
# Usage: scripts/test-all.sh            (from anywhere; needs cargo, a C/C++ compiler, cmake, python3)
#        ACCALLOC_ASAN=ON scripts/test-all.sh   also builds and runs the C tests under AddressSanitizer
#        ACCALLOC_VALGRIND=ON ...              also runs the C tests under valgrind
#        ACCALLOC_FUZZ_SECONDS=20 ...          also fuzzes each target that long (scripts/fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh

# What a fresh machine may lack is set up here, in the first seconds, or the run stops saying how.
scripts/setup-tools.sh
if ! command -v cmake >/dev/null 2>&1; then
  PATH="$PATH:$(python3 -m site --user-base)/bin"
  export PATH
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets -- -D warnings
mkdir -p build/logs
echo "== cargo test"
cargo test 2>&1 | tee build/logs/cargo-test.log
echo "== cargo build --release"
cargo build --release
echo "== include/accalloc.h is what src/capi generates (cargo run -p accalloc-header -- --check)"
cargo run --quiet -p accalloc-header -- --check

run_ctest() {
  local build_dir=$1; shift
  cmake -S c_tests -B "$build_dir" -DACCALLOC_LIB_DIR="$PWD/target/release" -DACCALLOC_INCLUDE_DIR="$PWD/include" "$@"
  cmake --build "$build_dir" -j2
  ctest --test-dir "$build_dir" --output-on-failure 2>&1 | tee "build/logs/$(basename "$build_dir").log"
}
echo "== statistics against the independent model of PyTorch's allocator"
python3 scripts/check_model.py | tee build/logs/model.log

echo "== ctest"
run_ctest build/c_tests -DACCALLOC_VALGRIND="${ACCALLOC_VALGRIND:-OFF}"
if [ "${ACCALLOC_ASAN:-OFF}" = "ON" ]; then
  echo "== ctest under AddressSanitizer"
  run_ctest build/c_tests_asan -DACCALLOC_ASAN=ON
fi

echo "== the CUDA backend on the strict model of the CUDA driver (scripts/cuda-model.sh, cuda_model/)"
# The model builds in its own target folder whatever CARGO_TARGET_DIR says: its libcuda.so must never
# sit beside libaccalloc, where a program with that folder as its rpath would load it.
(cd cuda_model && cargo fmt -- --check &&
  cargo clippy --quiet --release --all-targets --target-dir target -- -D warnings &&
  cargo test --quiet --release --target-dir target)
ACCALLOC_CUDA_MODEL_DIR=$(scripts/cuda-model.sh)
export ACCALLOC_CUDA_MODEL_DIR
# The Rust tests of the CUDA backend, the runtime and the CLI with the model as libcuda: eight devices.
# A plain `cargo test` (above) reports them as ignored; here they are asked for with --include-ignored,
# and each fails if the model did not load. The check after it fails if any test was left out.
LD_LIBRARY_PATH=$ACCALLOC_CUDA_MODEL_DIR ACCALLOC_CUDA_MODEL_DEVICES=8 \
  cargo test --test cuda --test cuda_capture --test cuda_model --test cuda_model_faults --test cuda_pinned -- --include-ignored 2>&1 |
  tee build/logs/cargo-test-cuda-model.log
python3 scripts/test_counts.py --ran-all build/logs/cargo-test-cuda-model.log
# The C ABI suites that apply (all but the host's own configuration tests), on the model's CUDA with
# the host suites' two devices and capacity.
LD_LIBRARY_PATH=$ACCALLOC_CUDA_MODEL_DIR ACCALLOC_DEVICE=cuda ACCALLOC_CUDA_MODEL_DEVICES=2 \
  ACCALLOC_CUDA_MODEL_CAPACITY=1G ctest --test-dir build/c_tests -E '^config_' --output-on-failure 2>&1 |
  tee build/logs/ctest-cuda-model.log

echo "== the README's C quick start, as written"
scripts/readme-quickstart.sh

echo "== examples/quickstart.c"
mkdir -p build
cc -std=c99 -Wall -Wextra -pedantic -Werror -Iinclude examples/quickstart.c -Ltarget/release -laccalloc \
  -Wl,-rpath,"$PWD/target/release" -o build/quickstart
./build/quickstart
echo "== examples/framework_backend.cpp"
c++ -std=c++17 -Wall -Wextra -Werror -Iinclude examples/framework_backend.cpp -Ltarget/release -laccalloc \
  -Wl,-rpath,"$PWD/target/release" -o build/framework_backend
./build/framework_backend

echo "== the Python package inside PyTorch (scripts/test-python.sh)"
scripts/test-python.sh 2>&1 | tee build/logs/pytest.log
echo "== ruff check (the Python of python/, scripts/, examples/, c_tests/, tests/; ruff.toml)"
"$ACCALLOC_TORCH_VENV/bin/ruff" check .
echo "== the Python package in an environment made only by the README's steps (scripts/test-readme-python.sh)"
scripts/test-readme-python.sh 2>&1 | tee build/logs/readme-python.log
echo "== ONNX Runtime allocating through accalloc (scripts/test-ort.sh)"
scripts/test-ort.sh 2>&1 | tee build/logs/ort.log
echo "== examples/torch_host_device.py"
ACCALLOC_DEVICE=host "$ACCALLOC_TORCH_VENV/bin/python" examples/torch_host_device.py

if [ -n "${ACCALLOC_FUZZ_SECONDS:-}" ]; then
  echo "== fuzzing (${ACCALLOC_FUZZ_SECONDS}s a target)"
  scripts/fuzz.sh "$ACCALLOC_FUZZ_SECONDS"
fi

echo "== examples/snapshot_to_pickle.py (a snapshot for PyTorch's memory visualizer)"
./target/release/accalloc replay examples/traces/varying_sizes.jsonl --simulate --snapshot build/snapshot.json > /dev/null
python3 examples/snapshot_to_pickle.py build/snapshot.json build/snapshot.pickle

echo "== replay of the sample trace"
./target/release/accalloc replay examples/traces/transformer_train.jsonl
echo "== test counts (each runner's tests that passed, from its closing lines above)"
python3 -m doctest scripts/test_counts.py
cp build/logs/c_tests.log build/logs/ctest.log
python3 scripts/test_counts.py build/logs
echo "all tests passed"
