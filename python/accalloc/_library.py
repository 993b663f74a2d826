"""Loading libaccalloc and calling its C ABI: signatures, statuses, errors."""
import ctypes
import os
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_HEADER = _PACKAGE / "include" / "accalloc.h"


def _header_abi_version():
    """ACCALLOC_ABI_VERSION of the accalloc.h installed with the package (setup.py copies it from the
    checkout's include/): the C header is the one owner of the number."""
    match = re.search(r"^#define ACCALLOC_ABI_VERSION (\d+)$", _HEADER.read_text(), flags=re.M)
    if not match:
        raise ImportError(f"{_HEADER} has no ACCALLOC_ABI_VERSION: reinstall accalloc")
    return int(match.group(1))


def _header_struct(name):
    """The members of accalloc.h's `typedef struct NAME {...} NAME;`, in order, as (C type, member,
    array length or None): the ctypes mirrors below are built from the installed header, whose
    statistics are accalloc's table of them (crates/core/src/caching/stats.rs)."""
    text = _HEADER.read_text()
    match = re.search(rf"^typedef struct {name} {{\n(.*?)^}} {name};$", text, flags=re.M | re.S)
    if not match:
        raise ImportError(f"{_HEADER} declares no struct {name}: reinstall accalloc")
    body = re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)
    return [(ctype, member, int(length) if length else None)
            for ctype, member, length in re.findall(r"^\s*(\S.*?)\s+(\w+)(?:\[(\d+)\])?;$", body, flags=re.M)]


ABI_VERSION = _header_abi_version()
_LIBRARY = None

ACCALLOC_OK = 0
ACCALLOC_ERROR_OUT_OF_MEMORY = 4
ACCALLOC_ERROR_BUFFER_TOO_SMALL = 8
DEVICE_HOST = 0  # ACCALLOC_DEVICE_HOST
DEVICE_CUDA = 1  # ACCALLOC_DEVICE_CUDA


class AccallocError(RuntimeError):
    """A failed accalloc call: `status` is the ACCALLOC_* name, the message accalloc's own."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status


def _ctype(ctype, length):
    """The ctypes type of a member of a header struct."""
    types = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "size_t": ctypes.c_size_t}
    if ctype == "struct AccallocStat":
        found = Stat
    elif ctype in types:
        found = types[ctype]
    else:
        raise ImportError(f"{_HEADER}: a struct member of type {ctype}, which accalloc's Python package "
                          "does not know: reinstall accalloc")
    return found * length if length else found


class Stat(ctypes.Structure):
    """AccallocStat, as accalloc.h declares it."""
    _fields_ = [(member, _ctype(ctype, length)) for ctype, member, length in _header_struct("AccallocStat")]


class DeviceStats(ctypes.Structure):
    """AccallocDeviceStats, as accalloc.h declares it."""
    _fields_ = [(member, _ctype(ctype, length)) for ctype, member, length in _header_struct("AccallocDeviceStats")]


# The statistics by kind, in the header's order: kept per pool (Stat * 3), as one Stat, as one int64.
FAMILIES = tuple(name for name, kind in DeviceStats._fields_ if kind is Stat * 3)
SINGLE_FAMILIES = tuple(name for name, kind in DeviceStats._fields_ if kind is Stat)
SCALARS = tuple(name for name, kind in DeviceStats._fields_ if kind is ctypes.c_int64)


class PlannerStats(ctypes.Structure):
    """AccallocPlannerStats, as accalloc.h declares it: planned_placement's planner of one device."""
    _fields_ = [(member, _ctype(ctype, length)) for ctype, member, length in _header_struct("AccallocPlannerStats")]


class PoolId(ctypes.Structure):
    """AccallocPoolId: a private pool's id, PyTorch's MempoolId_t pair."""
    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]


ROUTE_THREAD = 0  # ACCALLOC_ROUTE_THREAD
ROUTE_STREAM = 1  # ACCALLOC_ROUTE_STREAM


def library_path():
    """The libaccalloc this package loads: ACCALLOC_LIBRARY, else the copy installed with the package."""
    given = os.environ.get("ACCALLOC_LIBRARY")
    if given:
        return Path(given)
    found = sorted((_PACKAGE / "lib").glob("libaccalloc.so.*"))
    if not found:
        raise ImportError(
            f"libaccalloc is missing from {_PACKAGE / 'lib'}: reinstall the package from an accalloc "
            "checkout (python3 -m pip install --no-build-isolation ./python), or set ACCALLOC_LIBRARY to a "
            "libaccalloc.so")
    return found[-1]


def _declare(lib):
    S, i32, i64p = ctypes.c_int, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)
    size_p = ctypes.POINTER(ctypes.c_size_t)
    u64p = ctypes.POINTER(ctypes.c_uint64)
    signatures = {
        "accalloc_malloc_on": (S, [i32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, i32, ctypes.c_void_p]),
        "accalloc_free": (S, [ctypes.c_void_p]),
        "accalloc_empty_cache": (S, []),
        "accalloc_empty_cache_on": (S, [i32]),
        "accalloc_get_device_stats_on": (S, [i32, i32, ctypes.POINTER(DeviceStats)]),
        "accalloc_memory_stats_json_on": (S, [i32, i32, ctypes.c_char_p, ctypes.c_size_t, size_p]),
        "accalloc_planner_stats_on": (S, [i32, i32, ctypes.POINTER(PlannerStats)]),
        "accalloc_memory_summary_on": (S, [i32, i32, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, size_p]),
        "accalloc_mem_get_info_on": (S, [i32, i32, u64p, u64p]),
        "accalloc_device_count_on": (S, [i32, ctypes.POINTER(i32)]),
        "accalloc_current_device_on": (S, [i32, ctypes.POINTER(i32)]),
        "accalloc_set_device_on": (S, [i32, i32]),
        "accalloc_set_allocator_settings_on": (S, [i32, ctypes.c_char_p]),
        "accalloc_get_allocator_settings_on": (S, [i32, ctypes.c_char_p, ctypes.c_size_t, size_p]),
        "accalloc_set_memory_fraction_on": (S, [i32, ctypes.c_double, i32]),
        "accalloc_get_memory_fraction_on": (S, [i32, ctypes.POINTER(ctypes.c_double), i32]),
        "accalloc_current_accelerator": (i32, []),
        "accalloc_device_type_name": (ctypes.c_char_p, [i32]),
        "accalloc_status_name": (ctypes.c_char_p, [ctypes.c_int32]),
        "accalloc_last_error_message": (ctypes.c_char_p, []),
        "accalloc_version": (ctypes.c_char_p, []),
        "accalloc_abi_version": (ctypes.c_uint32, []),
        "accalloc_check_abi": (S, [ctypes.c_uint32]),
        "accalloc_host_malloc_on": (S, [i32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
        "accalloc_pool_create_on": (S, [i32, i32, i32, i32, ctypes.POINTER(PoolId)]),
        "accalloc_pool_begin_on": (S, [i32, i32, PoolId, i32, ctypes.c_void_p]),
        "accalloc_pool_end_on": (S, [i32, i32, PoolId]),
        "accalloc_pool_release_on": (S, [i32, i32, PoolId]),
        "accalloc_pool_empty_cache_on": (S, [i32, i32, PoolId, i32]),
        "accalloc_pool_info_on": (S, [i32, i32, PoolId, i64p, i64p]),
        "accalloc_pool_create_with_functions_on": (S, [i32, i32, i32, i32, ctypes.c_void_p, ctypes.c_void_p,
                                                       ctypes.POINTER(PoolId)]),
        "accalloc_pool_set_sleepable_on": (S, [i32, i32, PoolId]),
        "accalloc_pool_pause_on": (S, [i32, i32, PoolId, i32]),
        "accalloc_pool_resume_on": (S, [i32, i32, PoolId]),
        "accalloc_pool_paused_bytes_on": (S, [i32, i32, PoolId, i64p]),
        "accalloc_pool_reserved_bytes_on": (S, [i32, i32, PoolId, ctypes.POINTER(Stat),
                                                ctypes.POINTER(Stat), ctypes.POINTER(Stat)]),
        "accalloc_memory_snapshot_json_on": (S, [i32, ctypes.c_char_p, ctypes.c_size_t, size_p]),
        "accalloc_record_memory_history_on": (S, [i32, i32, ctypes.c_size_t]),
        "accalloc_host_free": (S, [ctypes.c_void_p]),
        "accalloc_host_is_pinned": (S, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_bool)]),
        "accalloc_host_record_stream": (S, [ctypes.c_void_p, i32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_bool)]),
        "accalloc_host_empty_cache_on": (S, [i32]),
        "accalloc_host_memory_stats_json_on": (S, [i32, ctypes.c_char_p, ctypes.c_size_t, size_p]),
        "accalloc_host_reset_accumulated_memory_stats_on": (S, [i32]),
        "accalloc_host_reset_peak_memory_stats_on": (S, [i32]),
    }
    for name in ("accalloc_memory_allocated_on", "accalloc_max_memory_allocated_on", "accalloc_memory_reserved_on",
                 "accalloc_max_memory_reserved_on"):
        signatures[name] = (S, [i32, i32, i64p])
    for name in ("accalloc_reset_accumulated_memory_stats_on", "accalloc_reset_peak_memory_stats_on"):
        signatures[name] = (S, [i32, i32])
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def library():
    """libaccalloc, loaded once, globally (RTLD_GLOBAL): accalloc.torch's extensions link the same copy."""
    global _LIBRARY
    if _LIBRARY is None:
        path = library_path()
        if not path.exists():
            raise ImportError(f"ACCALLOC_LIBRARY={path} does not exist")
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        _declare(lib)
        _LIBRARY = lib
    return _LIBRARY


def check(status):
    """Raise AccallocError (MemoryError-like for out of memory) for a non-zero status."""
    if status == ACCALLOC_OK:
        return
    lib = library()
    name = lib.accalloc_status_name(status).decode()
    message = lib.accalloc_last_error_message().decode()
    raise AccallocError(name, message)
