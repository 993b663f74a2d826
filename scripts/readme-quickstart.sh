#!/usr/bin/env bash
# Compile and run the README's C programs exactly as written: in each section named below, the first
# ```c block becomes the named file, and every line of the ```sh block after it runs as is, from a
# folder that sees the repository's include/ and target/ (so the README and the code cannot drift
# apart). The C quick start's commands build the release library first; the later sections use it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build/readme-quickstart
rm -rf "$work" && mkdir -p "$work"
ln -s "$root/include" "$work/include"
ln -s "$root/target" "$work/target"

run_section() {
  local title=$1 file=$2 section
  section=$(sed -n "/^## $title\$/,/^## /p" "$root/README.md")
  printf '%s\n' "$section" | awk '/^```c$/ {on=1; next} /^```$/ && on {exit} on' > "$work/$file"
  printf '%s\n' "$section" | awk '/^```sh$/ {on=1; next} /^```$/ && on {exit} on' > "$work/$file.sh"
  [ -s "$work/$file" ] || { echo "README.md: no \`\`\`c block in the \"$title\" section"; exit 1; }
  [ -s "$work/$file.sh" ] || { echo "README.md: no \`\`\`sh block in the \"$title\" section"; exit 1; }
  (
    cd "$work"
    while IFS= read -r line; do
      [ -n "$line" ] || continue
      echo "+ $line"
      bash -euo pipefail -c "$line"
    done < "$file.sh"
  )
  echo "README \"$title\": $(grep -c . "$work/$file.sh") commands ran"
}

run_section "C quick start" app.c
run_section "Pools and hooks from C" pool_hooks.c
