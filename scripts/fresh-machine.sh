#!/usr/bin/env bash
# The README's test command as a fresh machine runs it: a clone of this checkout's HEAD in a temporary
# folder (no target/, no build/), the PyTorch environments (the tests' and the README's) in new empty
# folders, no cmake, ctest or cpack on PATH, and a Python user base of its own (so no
# `pip install --user cmake` from before).
# What may stay is what a fresh machine can fetch anyway: the package registries' download caches
# (pip's, cargo's). Run it before resolving an issue that touches setup.
#
# Usage: scripts/fresh-machine.sh [ENV=VALUE ...]    e.g. scripts/fresh-machine.sh ACCALLOC_ASAN=ON
#        ACCALLOC_FRESH_KEEP=1 keeps the temporary folder (about 6 GB) for a look afterwards.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/accalloc-fresh.XXXXXX")
# The log outlives the folder, for reading a failure.
log="${TMPDIR:-/tmp}/accalloc-fresh-machine.log"
cleanup() {
  if [ "${ACCALLOC_FRESH_KEEP:-}" = 1 ]; then
    echo "fresh-machine: kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  echo "fresh-machine: note: uncommitted changes are not in the clone (it tests HEAD)" >&2
fi
git clone --quiet --no-hardlinks "$root" "$work/clone"

# PATH without cmake, ctest and cpack: each directory holding one is replaced by a copy made of
# links to everything else in it.
hidden="cmake ctest cpack"
fresh_path=""
n=0
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
  [ -d "$dir" ] || continue
  holds=""
  for tool in $hidden; do
    [ -e "$dir/$tool" ] && holds=1
  done
  if [ -n "$holds" ]; then
    n=$((n + 1))
    shadow="$work/path/$n"
    mkdir -p "$shadow"
    for entry in "$dir"/*; do
      case " $hidden " in *" $(basename "$entry") "*) continue ;; esac
      ln -s "$entry" "$shadow/"
    done
    dir=$shadow
  fi
  fresh_path="${fresh_path:+$fresh_path:}$dir"
done
for tool in $hidden; do
  if PATH="$fresh_path" command -v "$tool" >/dev/null 2>&1; then
    echo "fresh-machine: could not hide $tool from PATH" >&2
    exit 1
  fi
done

echo "fresh-machine: $work/clone, ACCALLOC_TORCH_VENV=$work/torch-venv, ACCALLOC_README_ENV=$work/readme-env, PYTHONUSERBASE=$work/user, no cmake on PATH"
start=$(date +%s)
(
  cd "$work/clone"
  env PATH="$fresh_path" PYTHONUSERBASE="$work/user" ACCALLOC_TORCH_VENV="$work/torch-venv" \
    ACCALLOC_README_ENV="$work/readme-env" CARGO_TARGET_DIR="$work/clone/target" "$@" scripts/test-all.sh
) 2>&1 | tee "$log"
echo "fresh-machine: scripts/test-all.sh passed from a fresh clone in $(( $(date +%s) - start )) s (log: $log)"
