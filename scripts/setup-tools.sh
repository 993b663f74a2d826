#!/usr/bin/env bash
# Make sure the tools the tests need are here, installing what a fresh machine lacks:
# cmake (Debian's package as root, else the PyPI wheel for this user), pkg-config (as root), valgrind
# when ACCALLOC_VALGRIND=ON (as root). What cannot be had stops the run at once, saying how to get it.
set -euo pipefail

need() { # need TOOL HOW-TO-GET-IT
  command -v "$1" >/dev/null 2>&1 || { echo "setup-tools: '$1' is required and missing: $2" >&2; exit 1; }
}
need cargo "install the Rust toolchain (rustup)"
need cc "install a C compiler (gcc)"
need c++ "install a C++ compiler (g++)"
need python3 "install Python 3"

as_root() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=""
apt_install() {
  as_root || return 1
  if [ -z "$apt_updated" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt_updated=1
  fi
  echo "setup-tools: installing $* (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
}

if ! command -v cmake >/dev/null 2>&1; then
  apt_install cmake || true
fi
if ! command -v cmake >/dev/null 2>&1; then
  user_bin="$(python3 -m site --user-base)/bin"
  if [ ! -x "$user_bin/cmake" ]; then
    echo "setup-tools: installing cmake (python3 -m pip install --user cmake)"
    python3 -m pip install --quiet --user cmake >/dev/null 2>&1 ||
      python3 -m pip install --quiet --user --break-system-packages cmake >/dev/null 2>&1 || {
        echo "setup-tools: cmake is missing and could not be installed: install it (apt-get install cmake," \
             "or python3 -m pip install cmake) and run again" >&2
        exit 1
      }
  fi
  [ -x "$user_bin/cmake" ] || { echo "setup-tools: cmake installed but not found in $user_bin" >&2; exit 1; }
fi
if ! command -v pkg-config >/dev/null 2>&1; then
  apt_install pkg-config ||
    echo "setup-tools: warning: pkg-config is missing (apt-get install pkg-config): the pkg-config consumer test will not run" >&2
fi
if [ "${ACCALLOC_VALGRIND:-OFF}" = "ON" ] && ! command -v valgrind >/dev/null 2>&1; then
  apt_install valgrind ||
    echo "setup-tools: warning: valgrind is missing (apt-get install valgrind): the valgrind tests will not run" >&2
fi
if command -v rustup >/dev/null 2>&1; then
  for component in clippy rustfmt; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" ||
      rustup component add "$component" >/dev/null 2>&1 ||
      { echo "setup-tools: cargo $component is missing: rustup component add $component" >&2; exit 1; }
  done
fi
echo "setup-tools: cargo, cc, c++, python3, cmake$(command -v pkg-config >/dev/null && echo ', pkg-config')$(command -v valgrind >/dev/null && echo ', valgrind') ready"
