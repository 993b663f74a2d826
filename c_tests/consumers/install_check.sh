#!/bin/sh
# Install accalloc from the build in $2 under the prefix $1 (and again staged under a DESTDIR), then
# check the layout: the real shared library with its SONAME and links, static library, header,
# pkg-config file and CMake package.
set -eu
prefix=$1
lib_dir=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$prefix" "$prefix.stage"
ACCALLOC_LIB_DIR=$lib_dir PREFIX=$prefix "$repo/scripts/install.sh"
ACCALLOC_LIB_DIR=$lib_dir PREFIX=/usr/local DESTDIR=$prefix.stage "$repo/scripts/install.sh"
for root in "$prefix" "$prefix.stage/usr/local"; do
  for file in lib/libaccalloc.so lib/libaccalloc.a include/accalloc.h lib/pkgconfig/accalloc.pc \
              lib/cmake/accalloc/accallocConfig.cmake lib/cmake/accalloc/accallocConfigVersion.cmake \
              bin/accalloc; do
    test -e "$root/$file" || { echo "missing $root/$file"; exit 1; }
  done
done
# The tool the README's tune flow runs by its bare name works where it was installed.
"$prefix/bin/accalloc" --version >/dev/null
abi=$(sed -n 's/^#define ACCALLOC_ABI_VERSION \([0-9]*\)$/\1/p' "$prefix/include/accalloc.h")
test "$(readlink "$prefix/lib/libaccalloc.so")" = "libaccalloc.so.$abi"
soname=$(readelf -d "$prefix/lib/libaccalloc.so.$abi" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
test "$soname" = "libaccalloc.so.$abi" || { echo "SONAME is '$soname', expected libaccalloc.so.$abi"; exit 1; }
grep -q "^prefix=/usr/local$" "$prefix.stage/usr/local/lib/pkgconfig/accalloc.pc"
# Only the accalloc_ API leaves the shared library.
others=$(nm -D --defined-only "$prefix/lib/libaccalloc.so" | awk '{print $3}' | grep -v '^accalloc_' || true)
test -z "$others" || { echo "exported beyond the accalloc_ API: $others"; exit 1; }
echo "installed layout ok: SONAME $soname, $(nm -D --defined-only "$prefix/lib/libaccalloc.so" | grep -c ' accalloc_') accalloc_ functions exported"
