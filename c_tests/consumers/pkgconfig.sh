#!/bin/sh
# Build consumer.c against the accalloc installed under $1 with pkg-config, in folder $2, and run it.
set -eu
prefix=$1
out=$2
mkdir -p "$out"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags=$(pkg-config --cflags --libs accalloc)
echo "pkg-config --cflags --libs accalloc: $flags"
test "$(pkg-config --modversion accalloc)" != ""
# No rpath of our own: the pkg-config file must give what the program needs to start.
cc -std=c99 -Wall -Werror "$(dirname "$0")/consumer.c" $flags -o "$out/consumer_pkgconfig"
"$out/consumer_pkgconfig"
