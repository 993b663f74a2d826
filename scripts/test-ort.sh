#!/usr/bin/env bash
# ONNX Runtime allocating through accalloc: tests/ort.rs against the real ORT of the Python test
# environment (ACCALLOC_TORCH_VENV, its default set in scripts/lib/env.sh, with the onnxruntime and
# onnx packages of python/requirements-test.txt; scripts/test-python.sh installs them). The models
# come from python/tests/make_ort_models.py, written to build/ort-models. Fails when ORT or the
# models cannot be found, or when any test of tests/ort.rs did not run against ORT (a plain
# `cargo test` reports the ones that need ORT as ignored; here they run with --include-ignored).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/env.sh"
venv=$ACCALLOC_TORCH_VENV
python=$venv/bin/python

if [ ! -x "$python" ]; then
  echo "test-ort.sh: no Python at $python: run scripts/test-python.sh first, or set ACCALLOC_TORCH_VENV" >&2
  exit 1
fi
# The wheel ships libonnxruntime.so.1.<minor>.<patch> beside its Python bindings.
capi=$("$python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))') || {
  echo "test-ort.sh: onnxruntime is not installed in $venv: $venv/bin/pip install onnxruntime onnx" >&2
  exit 1
}
library=$(find "$capi" -maxdepth 1 -name 'libonnxruntime.so.1.*' | sort -V | tail -n 1)
if [ -z "$library" ]; then
  echo "test-ort.sh: no libonnxruntime.so.1.* in $capi" >&2
  exit 1
fi

models=$root/build/ort-models
echo "== python/tests/make_ort_models.py -> $models"
"$python" "$root/python/tests/make_ort_models.py" "$models"

echo "== cargo test --test ort (ORT: $library)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cd "$root"
# The tests that need ORT are #[ignore]d in a plain `cargo test`: asked for here, they run against
# this ORT, and fail (not skip) if they cannot load it.
ACCALLOC_ORT_LIBRARY=$library ACCALLOC_ORT_MODELS=$models \
  cargo test --test ort -- --include-ignored --nocapture 2>&1 | tee "$log"
# Every test of tests/ort.rs ran and passed: none ignored, none filtered out.
python3 "$root/scripts/test_counts.py" --ran-all "$log" || {
  echo "test-ort.sh: not every ORT test ran" >&2
  exit 1
}
echo "== ORT tests passed against $(basename "$library")"
