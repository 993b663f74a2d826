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
cc -std=c99 -Wall -Werror "$(dirname "$0")/consumer.c" $flags -Wl,-rpath,"$prefix/lib" -o "$out/consumer_pkgconfig"
"$out/consumer_pkgconfig"
