#!/usr/bin/env bash
# ONNX Runtime allocating through accalloc: tests/ort.rs against the real ORT of the Python test
# environment (ACCALLOC_TORCH_VENV, default ~/.cache/accalloc/torch-2.15, with the onnxruntime and onnx
# packages of python/requirements-test.txt; scripts/test-python.sh installs them). The models come from
# python/tests/make_ort_models.py, written to build/ort-models. Fails when ORT or the models cannot be
# found, or when the tests did not run against ORT.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${ACCALLOC_TORCH_VENV:-$HOME/.cache/accalloc/torch-2.15}
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
ACCALLOC_ORT_LIBRARY=$library ACCALLOC_ORT_MODELS=$models cargo test --test ort -- --nocapture 2>&1 | tee "$log"
# A test that found no ORT says so and passes: here that is a failure.
if grep -q "skipping ORT test" "$log"; then
  echo "test-ort.sh: the ORT tests were skipped" >&2
  exit 1
fi
if ! grep -Eq "test result: ok\. [1-9][0-9]* passed" "$log"; then
  echo "test-ort.sh: no ORT test ran" >&2
  exit 1
fi
echo "== ORT tests passed against $(basename "$library")"
