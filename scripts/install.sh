#!/usr/bin/env bash
# Install accalloc the way C libraries install: the versioned shared library with its SONAME links, the
# static library, the header, a pkg-config file and a CMake package (imported target accalloc::accalloc);
# and the command-line tool, PREFIX/bin/accalloc (replay, tune, compare, ...).
#
#   PREFIX=/opt/accalloc scripts/install.sh          (default PREFIX: /usr/local)
#   DESTDIR=/tmp/stage PREFIX=/usr scripts/install.sh   (staged, for packaging)
#
# Builds the release library and tool first unless ACCALLOC_LIB_DIR names a folder that already holds
# libaccalloc.so, libaccalloc.a and the accalloc tool (cargo build --release puts all three in
# target/release). Our own script rather than cargo-c: nothing to install first, and
# the layout stays in one short file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${PREFIX:-/usr/local}
destdir=${DESTDIR:-}
libdir_name=${LIBDIR_NAME:-lib}

lib_dir=${ACCALLOC_LIB_DIR:-}
if [ -z "$lib_dir" ]; then
  (cd "$root" && cargo build --release)
  lib_dir=$root/target/release
fi
for file in libaccalloc.so libaccalloc.a accalloc; do
  [ -f "$lib_dir/$file" ] || { echo "install.sh: $lib_dir/$file not found (cargo build --release makes it)" >&2; exit 1; }
done

header=$root/include/accalloc.h
abi=$(sed -n 's/^#define ACCALLOC_ABI_VERSION \([0-9]*\)$/\1/p' "$header")
major=$(sed -n 's/^#define ACCALLOC_VERSION_MAJOR \([0-9]*\)$/\1/p' "$header")
minor=$(sed -n 's/^#define ACCALLOC_VERSION_MINOR \([0-9]*\)$/\1/p' "$header")
patch=$(sed -n 's/^#define ACCALLOC_VERSION_PATCH \([0-9]*\)$/\1/p' "$header")
version=$major.$minor.$patch
soname=libaccalloc.so.$abi
real_name=$soname.$version

lib=$destdir$prefix/$libdir_name
include=$destdir$prefix/include
bin=$destdir$prefix/bin
mkdir -p "$lib/pkgconfig" "$lib/cmake/accalloc" "$include" "$bin"

install -m 0755 "$lib_dir/libaccalloc.so" "$lib/$real_name"
ln -sf "$real_name" "$lib/$soname"
ln -sf "$soname" "$lib/libaccalloc.so"
install -m 0644 "$lib_dir/libaccalloc.a" "$lib/libaccalloc.a"
install -m 0644 "$header" "$include/accalloc.h"
install -m 0755 "$lib_dir/accalloc" "$bin/accalloc"

# Programs linked against a prefix the loader does not search would not start: outside /usr, the
# pkg-config file and the CMake package carry an rpath to the installed library folder.
rpath_flag=""
if [ "$prefix" != "/usr" ]; then
  rpath_flag="-Wl,-rpath,\${libdir}"
fi

cat > "$lib/pkgconfig/accalloc.pc" <<PC
prefix=$prefix
libdir=\${prefix}/$libdir_name
includedir=\${prefix}/include

Name: accalloc
Description: Caching device-memory allocator with PyTorch-compatible statistics
Version: $version
Libs: -L\${libdir} -laccalloc $rpath_flag
Libs.private: -lpthread -ldl -lm
Cflags: -I\${includedir}
PC

cat > "$lib/cmake/accalloc/accallocConfig.cmake" <<'CMAKE'
# accalloc's CMake package: find_package(accalloc CONFIG REQUIRED), then link accalloc::accalloc
# (the shared library) or accalloc::accalloc_static.
get_filename_component(_accalloc_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include(CMakeFindDependencyMacro)
find_dependency(Threads)
if(NOT TARGET accalloc::accalloc)
  add_library(accalloc::accalloc SHARED IMPORTED)
  set_target_properties(accalloc::accalloc PROPERTIES
    IMPORTED_LOCATION "${_accalloc_prefix}/@LIBDIR@/@REAL_NAME@"
    IMPORTED_SONAME "@SONAME@"
    INTERFACE_INCLUDE_DIRECTORIES "${_accalloc_prefix}/include")
  if(NOT _accalloc_prefix STREQUAL "/usr")
    # Outside /usr the loader would not find the library: the programs that link it carry an rpath.
    set_target_properties(accalloc::accalloc PROPERTIES
      INTERFACE_LINK_OPTIONS "LINKER:-rpath,${_accalloc_prefix}/@LIBDIR@")
  endif()
  add_library(accalloc::accalloc_static STATIC IMPORTED)
  set_target_properties(accalloc::accalloc_static PROPERTIES
    IMPORTED_LOCATION "${_accalloc_prefix}/@LIBDIR@/libaccalloc.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_accalloc_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS};m")
endif()
unset(_accalloc_prefix)
CMAKE
sed -i "s|@LIBDIR@|$libdir_name|g; s|@REAL_NAME@|$real_name|g; s|@SONAME@|$soname|g" "$lib/cmake/accalloc/accallocConfig.cmake"

cat > "$lib/cmake/accalloc/accallocConfigVersion.cmake" <<CMAKE
# Compatible when the same major version (and, below 1.0, the same minor) is at least what was asked.
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif(NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL "$major")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif("$major" STREQUAL "0" AND NOT PACKAGE_FIND_VERSION_MINOR STREQUAL "$minor")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE

echo "installed accalloc $version (ABI $abi) under $destdir$prefix:"
echo "  $libdir_name/$real_name (links $soname, libaccalloc.so), $libdir_name/libaccalloc.a, include/accalloc.h"
echo "  $libdir_name/pkgconfig/accalloc.pc, $libdir_name/cmake/accalloc (find_package(accalloc))"
echo "  bin/accalloc, the tool (accalloc --help)"
case ":${PATH:-}:" in
  *":$prefix/bin:"*) ;;
  *) echo "$prefix/bin is not on PATH: run the tool as $prefix/bin/accalloc, or add $prefix/bin to PATH" ;;
esac
