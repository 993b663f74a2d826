#!/usr/bin/env bash
# Compile and run the README's C quick start exactly as written: the first ```c block of its
# "## C quick start" section becomes app.c, and every line of the ```sh block after it runs as is,
# from a folder that sees the repository's include/ and target/ (so the two cannot drift apart).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build/readme-quickstart
rm -rf "$work" && mkdir -p "$work"
ln -s "$root/include" "$work/include"
ln -s "$root/target" "$work/target"
section=$(sed -n '/^## C quick start$/,/^## /p' "$root/README.md")
printf '%s\n' "$section" | awk '/^```c$/ {on=1; next} /^```$/ && on {exit} on' > "$work/app.c"
printf '%s\n' "$section" | awk '/^```sh$/ {on=1; next} /^```$/ && on {exit} on' > "$work/commands.sh"
[ -s "$work/app.c" ] || { echo "README.md: no \`\`\`c block in the C quick start section"; exit 1; }
[ -s "$work/commands.sh" ] || { echo "README.md: no \`\`\`sh block in the C quick start section"; exit 1; }
cd "$work"
while IFS= read -r line; do
  [ -n "$line" ] || continue
  echo "+ $line"
  bash -euo pipefail -c "$line"
done < commands.sh
echo "README quick start: $(grep -c . commands.sh) commands ran"
