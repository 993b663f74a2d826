#!/usr/bin/env bash
# The Python and PyTorch tests: the accalloc package installed from this checkout into an environment
# with torch 2.15, then pytest on python/tests inside real PyTorch.
#
# The environment lives outside the clone, so every clone (and every CI run) reuses it:
# ACCALLOC_TORCH_VENV, its default set in scripts/lib/env.sh. Made once when missing; every run
# installs python/requirements-test.txt into it (torch 2.15.0 from the package registry is about
# 5.4 GB, about 80 s to install here, once) and checks the whole list. Nothing outside that list is
# added: the package must build in any environment with torch (use_for_cuda's extension needs no
# CUDA headers).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/env.sh"
venv=$ACCALLOC_TORCH_VENV
torch_version=2.15.0
python=$venv/bin/python

requirements=$root/python/requirements-test.txt

if [ ! -x "$python" ]; then
  echo "== creating $venv (torch $torch_version is about 5.4 GB, once; later runs reuse it)"
  python3 -m venv "$venv"
  "$python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
fi
# Every run: pip does nothing when all is satisfied, and installs what a package list grew by.
echo "== pip install -r python/requirements-test.txt"
"$python" -m pip install --quiet -r "$requirements"
# Then the whole list is checked by name (and torch's version), so that a missing package stops the
# run here, named, and not at pytest's collection minutes later.
"$python" "$root/scripts/lib/check_requirements.py" "$requirements" "$torch_version"
# The environment's ninja (from the package list) builds the extensions' sources in parallel.
export PATH="$venv/bin:$PATH"
echo "== python3 -m pip install --no-build-isolation ./python (libaccalloc and accalloc.torch's C++ extensions)"
start=$(date +%s)
install_log=$(mktemp)
if ! (cd "$root" && "$python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python) \
    > "$install_log" 2>&1; then
  cat "$install_log"; rm -f "$install_log"; exit 1
fi
cat "$install_log"
# A deprecation setuptools warns of today is an install it refuses on a later date (the table form
# of project.license was one): the install must give none.
if grep -q "SetuptoolsDeprecationWarning\|BuildBackendWarning" "$install_log"; then
  rm -f "$install_log"
  echo "the install of ./python warns of a deprecation (above): setuptools is to refuse it"; exit 1
fi
rm -f "$install_log"
echo "installed in $(( $(date +%s) - start )) s"

echo "== pytest python/tests (inside torch $("$python" -c 'import torch; print(torch.__version__)'))"
cd "$root/python/tests"
"$python" -m pytest -q -p no:cacheprovider "$@"
