# Sourced, not run: the default folders of the test environments, in one place. Both live outside
# the clone, so that every clone (and every CI run) reuses them; a value already set wins
# (scripts/fresh-machine.sh sets both to new empty folders).
#   ACCALLOC_TORCH_VENV  the PyTorch test environment (python/requirements-test.txt), made and kept
#                        up to date by scripts/test-python.sh, used by test-ort.sh, gpu-check.sh, ruff
#   ACCALLOC_README_ENV  the work folder of scripts/test-readme-python.sh (the README's own steps)
# Not exported: each script that needs them sources this file.
# shellcheck shell=bash
: "${ACCALLOC_TORCH_VENV:=$HOME/.cache/accalloc/torch-2.15}"
: "${ACCALLOC_README_ENV:=$HOME/.cache/accalloc/readme-env}"
