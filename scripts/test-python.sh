#!/usr/bin/env bash
# The Python and PyTorch tests: the accalloc package installed from this checkout into an environment
# with torch 2.15, then pytest on python/tests inside real PyTorch.
#
# The environment lives outside the clone, so every clone (and every CI run) reuses it:
# ACCALLOC_TORCH_VENV, default ~/.cache/accalloc/torch-2.15. Made once when missing: torch 2.15.0 from
# the package registry is about 5.4 GB (about 80 s to install here), plus pytest, expecttest, ninja and
# the CUDA C runtime headers that accalloc.torch.use_for_cuda's extension compiles against.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${ACCALLOC_TORCH_VENV:-$HOME/.cache/accalloc/torch-2.15}
torch_version=2.15.0
python=$venv/bin/python

has_torch() {
  [ -x "$python" ] && "$python" -c "import sys, torch, pytest, expecttest
sys.exit(torch.__version__.split('+')[0] != '$torch_version')" >/dev/null 2>&1
}
if ! has_torch; then
  echo "== creating $venv with torch $torch_version (about 5.4 GB, once; later runs reuse it)"
  python3 -m venv "$venv"
  "$python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  "$python" -m pip install --quiet "torch==$torch_version" pytest expecttest ninja
fi
# The CUDA runtime wheel torch depends on ships cuda_runtime_api.h without the crt/ headers it
# includes: those come in nvidia-cuda-crt of the same CUDA version.
runtime=$("$python" -m pip show nvidia-cuda-runtime 2>/dev/null | sed -n 's/^Version: \([0-9]*\.[0-9]*\).*/\1/p')
if [ -n "$runtime" ] && ! "$python" -m pip show nvidia-cuda-crt >/dev/null 2>&1; then
  "$python" -m pip install --quiet "nvidia-cuda-crt==$runtime.*" ||
    echo "warning: nvidia-cuda-crt $runtime could not be installed: accalloc.torch.use_for_cuda will not be built" >&2
fi

echo "== python3 -m pip install --no-build-isolation ./python (libaccalloc and accalloc.torch's C++ extensions)"
start=$(date +%s)
(cd "$root" && "$python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python)
echo "installed in $(( $(date +%s) - start )) s"

echo "== pytest python/tests (inside torch $("$python" -c 'import torch; print(torch.__version__)'))"
cd "$root/python/tests"
"$python" -m pytest -q -p no:cacheprovider "$@"
