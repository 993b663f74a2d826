#!/usr/bin/env bash
# The Python package installed as a user installs it: the ```sh block of the README's "### PyTorch"
# section runs as written (it makes an environment with only what a PyTorch user has: torch, numpy,
# ninja; nothing is added by this script), then python/tests/readme_env_check.py checks, in that
# environment, what a user tries first. So the README's steps and a stock environment cannot drift
# apart from what the project's own test environment (scripts/test-python.sh) hides.
#
# The work folder outside the clone is reused (ACCALLOC_README_ENV, its default set in
# scripts/lib/env.sh): the steps run every time, and pip does nothing for what is there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/env.sh"
work=$ACCALLOC_README_ENV
mkdir -p "$work"
ln -sfn "$root/python" "$work/python"
steps=$work/readme-steps.sh
# One awk over the whole file (no early exit in a pipe, which pipefail would see as SIGPIPE): the first
# ```sh block after the "### PyTorch" heading.
awk '/^### PyTorch$/ {section=1; next} section && /^### / {section=0}
     section && !done && /^```sh$/ {on=1; next} on && /^```$/ {on=0; done=1} on' "$root/README.md" > "$steps"
[ -s "$steps" ] || { echo "README.md: no \`\`\`sh block in the ### PyTorch section"; exit 1; }
echo "== the README's steps, in $work:"
sed 's/^/+ /' "$steps"
(cd "$work" && bash -euo pipefail "$steps")
env_python=$(sed -n 's/^python3 -m venv \([^ ]*\).*/\1/p' "$steps" | head -1)
[ -n "$env_python" ] || { echo "README.md: the ### PyTorch steps make no environment (python3 -m venv ...)"; exit 1; }
echo "== what a user tries first, inside that environment"
"$work/$env_python/bin/python" "$root/python/tests/readme_env_check.py"
