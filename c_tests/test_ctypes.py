#!/usr/bin/env python3
"""python_ctypes: accalloc from Python through ctypes, as a Python framework without a compiler would use it.

Usage: test_ctypes.py /path/to/libaccalloc.so [--libgomp-first /path/to/libgomp.so.1]
       (run with ACCALLOC_HOST_CAPACITY=1GiB ACCALLOC_HOST_DEVICES=2)

With --libgomp-first, GCC's OpenMP/OpenACC runtime is loaded with RTLD_GLOBAL before accalloc (as
`import torch` does), and accalloc too is loaded globally: OpenACC's acc_malloc and accalloc's
functions then live side by side in the process's global scope, and every check below must still hold.

Checks malloc/free, that memory_stats_json is one JSON object of exactly the 122 PyTorch keys, sorted,
each equal to accalloc_memory_stat and to the AccallocDeviceStats struct, and the error statuses.
"""
import ctypes
import json
import math
import os
import sys

ACCALLOC_OK = 0
ACCALLOC_ERROR_INVALID_ARGUMENT = 1
ACCALLOC_ERROR_INVALID_DEVICE = 2
ACCALLOC_ERROR_INVALID_POINTER = 3
ACCALLOC_ERROR_OUT_OF_MEMORY = 4
ACCALLOC_ERROR_CONFIG = 7
ACCALLOC_ERROR_BUFFER_TOO_SMALL = 8
STATUS_NAMES = [
    "ACCALLOC_OK", "ACCALLOC_ERROR_INVALID_ARGUMENT", "ACCALLOC_ERROR_INVALID_DEVICE", "ACCALLOC_ERROR_INVALID_POINTER",
    "ACCALLOC_ERROR_OUT_OF_MEMORY", "ACCALLOC_ERROR_BACKEND", "ACCALLOC_ERROR_NOT_SUPPORTED", "ACCALLOC_ERROR_CONFIG",
    "ACCALLOC_ERROR_BUFFER_TOO_SMALL", "ACCALLOC_ERROR_INTERNAL",
]
GIB = 1 << 30

# The statistics as accalloc.h declares them, spelled here on purpose (a ctypes user's own mirror);
# tests/stats_table.rs checks these lists against accalloc's table of statistics.
FAMILIES = ["allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
            "active_bytes", "inactive_split_bytes", "requested_bytes"]
SINGLES = ["oversize_allocations", "oversize_segments"]
POOLS = ["all", "small_pool", "large_pool"]  # ACCALLOC_STAT_ALL, ACCALLOC_STAT_SMALL_POOL, ACCALLOC_STAT_LARGE_POOL
FIELDS = ["current", "peak", "allocated", "freed"]
SCALARS = ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
           "max_split_size"]
EXPECTED_KEYS = sorted(
    [f"{fam}.{pool}.{field}" for fam in FAMILIES for pool in POOLS for field in FIELDS]
    + [f"{fam}.{field}" for fam in SINGLES for field in FIELDS]
    + SCALARS)


class AccallocStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in FIELDS]


class AccallocDeviceStats(ctypes.Structure):
    _fields_ = ([("struct_size", ctypes.c_size_t)]
                + [(fam, AccallocStat * 3) for fam in FAMILIES]
                + [(fam, AccallocStat) for fam in SINGLES]
                + [(name, ctypes.c_int64) for name in SCALARS])

    def flat(self):
        out = {}
        for fam in FAMILIES:
            for i, pool in enumerate(POOLS):
                for field in FIELDS:
                    out[f"{fam}.{pool}.{field}"] = getattr(getattr(self, fam)[i], field)
        for fam in SINGLES:
            for field in FIELDS:
                out[f"{fam}.{field}"] = getattr(getattr(self, fam), field)
        for name in SCALARS:
            out[name] = getattr(self, name)
        return out


checks = 0
failures = 0


def check(ok, what):
    global checks, failures
    checks += 1
    if not ok:
        failures += 1
        print(f"FAIL {what}", file=sys.stderr)


def check_eq(got, want, what):
    check(got == want, f"{what}: expected {want!r}, got {got!r}")


def load(path, mode=ctypes.DEFAULT_MODE):
    lib = ctypes.CDLL(path, mode=mode)
    S = ctypes.c_int  # AccallocStatus: a C enum, int-sized
    sig = {
        "accalloc_malloc": (S, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p]),
        "accalloc_free": (S, [ctypes.c_void_p]),
        "accalloc_empty_cache": (S, []),
        "accalloc_get_device_stats": (S, [ctypes.c_int32, ctypes.POINTER(AccallocDeviceStats)]),
        "accalloc_memory_allocated": (S, [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]),
        "accalloc_max_memory_allocated": (S, [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]),
        "accalloc_memory_reserved": (S, [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]),
        "accalloc_max_memory_reserved": (S, [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]),
        "accalloc_reset_accumulated_memory_stats": (S, [ctypes.c_int32]),
        "accalloc_reset_peak_memory_stats": (S, [ctypes.c_int32]),
        "accalloc_memory_stat": (S, [ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]),
        "accalloc_memory_stats_json": (S, [ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.POINTER(ctypes.c_size_t)]),
        "accalloc_mem_get_info": (S, [ctypes.c_int32, ctypes.POINTER(ctypes.c_uint64),
                                      ctypes.POINTER(ctypes.c_uint64)]),
        "accalloc_set_memory_fraction": (S, [ctypes.c_double, ctypes.c_int32]),
        "accalloc_device_count": (S, [ctypes.POINTER(ctypes.c_int32)]),
        "accalloc_current_device": (S, [ctypes.POINTER(ctypes.c_int32)]),
        "accalloc_set_device": (S, [ctypes.c_int32]),
        "accalloc_current_accelerator": (ctypes.c_int32, []),
        "accalloc_device_type_name": (ctypes.c_char_p, [ctypes.c_int32]),
        "accalloc_status_name": (ctypes.c_char_p, [S]),
        "accalloc_last_error_message": (ctypes.c_char_p, []),
        "accalloc_version": (ctypes.c_char_p, []),
        "accalloc_abi_version": (ctypes.c_uint32, []),
        "accalloc_set_allocator_settings": (S, [ctypes.c_char_p]),
        "accalloc_record_stream": (S, [ctypes.c_void_p, ctypes.c_void_p]),
        "accalloc_memory_summary": (S, [ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_size_t)]),
        "accalloc_memory_snapshot_json": (S, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "accalloc_record_memory_history": (S, [ctypes.c_int32, ctypes.c_size_t]),
        "accalloc_get_allocator_settings": (S, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


ON_CUDA = os.environ.get("ACCALLOC_DEVICE") == "cuda"


def other_stream(device):
    """A stream for "another stream": any handle on the host backend; a real CUstream of `device` on
    CUDA (the driver model in scripts/test-all.sh), where the driver checks handles."""
    if not ON_CUDA:
        return ctypes.c_void_p(0x3000)
    cuda = ctypes.CDLL("libcuda.so.1")
    handle, context, stream = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(handle), device) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle) == 0
    assert cuda.cuCtxSetCurrent(context) == 0
    assert cuda.cuStreamCreate(ctypes.byref(stream), 1) == 0
    return stream


def main():
    if len(sys.argv) == 2:
        lib = load(sys.argv[1])
    elif len(sys.argv) == 4 and sys.argv[2] == "--libgomp-first":
        gomp = ctypes.CDLL(sys.argv[3], mode=ctypes.RTLD_GLOBAL)
        lib = load(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
        # OpenACC's allocator is there and works; the process's global scope resolves acc_malloc to
        # libgomp's and accalloc_malloc to ours, and accalloc defines no acc_ name of its own.
        gomp.acc_malloc.restype = ctypes.c_void_p
        gomp.acc_malloc.argtypes = [ctypes.c_size_t]
        gomp.acc_free.argtypes = [ctypes.c_void_p]
        openacc_block = gomp.acc_malloc(4096)
        check(openacc_block is not None, "OpenACC's acc_malloc(4096) from libgomp")
        gomp.acc_free(openacc_block)
        process = ctypes.CDLL(None)
        check(ctypes.cast(process.acc_malloc, ctypes.c_void_p).value
              == ctypes.cast(gomp.acc_malloc, ctypes.c_void_p).value, "acc_malloc resolves to libgomp's")
        check(ctypes.cast(process.accalloc_malloc, ctypes.c_void_p).value
              == ctypes.cast(lib.accalloc_malloc, ctypes.c_void_p).value, "accalloc_malloc resolves to ours")
    else:
        print(__doc__, file=sys.stderr)
        return 2

    def last_error():
        return lib.accalloc_last_error_message().decode()

    def stat(device, key):
        v = ctypes.c_int64(-12345)
        st = lib.accalloc_memory_stat(device, key.encode(), ctypes.byref(v))
        check_eq(st, ACCALLOC_OK, f"accalloc_memory_stat({device}, {key!r}) status ({last_error()})")
        return v.value

    def device_stats(device):
        s = AccallocDeviceStats()
        s.struct_size = ctypes.sizeof(AccallocDeviceStats)
        check_eq(lib.accalloc_get_device_stats(device, ctypes.byref(s)), ACCALLOC_OK,
                 f"accalloc_get_device_stats({device})")
        return s.flat()

    def stats_json(device):
        need = ctypes.c_size_t(0)
        check_eq(lib.accalloc_memory_stats_json(device, None, 0, ctypes.byref(need)), ACCALLOC_OK, "json size query")
        buf = ctypes.create_string_buffer(b"Z" * (need.value + 8), need.value + 8)
        got = ctypes.c_size_t(0)
        # one byte short: refused, the size is reported, the buffer is left alone
        check_eq(lib.accalloc_memory_stats_json(device, buf, need.value - 1, ctypes.byref(got)),
                 ACCALLOC_ERROR_BUFFER_TOO_SMALL, "json with a buffer one byte short")
        check_eq(got.value, need.value, "len reported with a short buffer")
        check(buf.raw == b"Z" * (need.value + 8), "short buffer left untouched")
        check_eq(lib.accalloc_memory_stats_json(device, buf, need.value, ctypes.byref(got)), ACCALLOC_OK, "json")
        check_eq(got.value, need.value, "len = bytes written including the NUL")
        check_eq(len(buf.value) + 1, need.value, "strlen + 1 = len")
        pairs = json.loads(buf.value.decode(), object_pairs_hook=lambda kv: kv)
        return pairs

    def check_consistency(device, where):
        pairs = stats_json(device)
        keys = [k for k, _ in pairs]
        check_eq(len(keys), 122, f"[{where}] number of JSON keys")
        check_eq(len(set(keys)), len(keys), f"[{where}] JSON keys are unique")
        check(keys == sorted(keys), f"[{where}] JSON keys are sorted: {keys}")
        check_eq(keys, EXPECTED_KEYS, f"[{where}] JSON keys are PyTorch's memory_stats() keys")
        flat = device_stats(device)
        for key, value in pairs:
            check(isinstance(value, int), f"[{where}] {key} is an integer in JSON")
            check_eq(value, stat(device, key), f"[{where}] JSON {key} vs accalloc_memory_stat")
            check_eq(value, flat.get(key), f"[{where}] JSON {key} vs AccallocDeviceStats")
        return dict(pairs)

    # --- identity ---
    check_eq(lib.accalloc_version(), b"0.1.0", "accalloc_version")
    check_eq(lib.accalloc_abi_version(), 2, "accalloc_abi_version")
    check_eq(last_error(), "", "no error yet")
    for i, name in enumerate(STATUS_NAMES):
        check_eq(lib.accalloc_status_name(i), name.encode(), f"accalloc_status_name({i})")
    check_eq(lib.accalloc_status_name(99), b"ACCALLOC_ERROR_UNKNOWN", "accalloc_status_name(99)")
    check_eq(lib.accalloc_current_accelerator(), 1 if ON_CUDA else 0,
             "accalloc_current_accelerator is ACCALLOC_DEVICE_CUDA on CUDA, else ACCALLOC_DEVICE_HOST")
    check_eq(lib.accalloc_device_type_name(0), b"host", "device type 0")
    check_eq(lib.accalloc_device_type_name(1), b"cuda", "device type 1")
    check_eq(lib.accalloc_device_type_name(42), b"unknown", "device type 42")
    n = ctypes.c_int32(-1)
    check_eq(lib.accalloc_device_count(ctypes.byref(n)), ACCALLOC_OK, "accalloc_device_count")
    check_eq(n.value, 2, "device count")
    check_eq(lib.accalloc_current_device(ctypes.byref(n)), ACCALLOC_OK, "accalloc_current_device")
    check_eq(n.value, 0, "current device")

    # --- fresh ---
    fresh = check_consistency(0, "fresh")
    check(all(v == 0 for k, v in fresh.items() if k != "max_split_size"), "fresh device: all zero")
    check_eq(fresh.get("max_split_size"), -1, "max_split_size unset")

    # --- malloc(1000) ---
    p = ctypes.c_void_p()
    check_eq(lib.accalloc_malloc(ctypes.byref(p), 1000, -1, None), ACCALLOC_OK, "accalloc_malloc(1000)")
    check(p.value is not None, "pointer returned")
    ctypes.memset(p, 0x5A, 1000)  # host memory: usable
    check_eq(ctypes.string_at(p, 4), b"ZZZZ", "the block holds what was written")
    after = check_consistency(0, "after malloc(1000)")
    expected = {
        "allocated_bytes.all.current": 1024, "allocated_bytes.small_pool.current": 1024,
        "allocated_bytes.large_pool.current": 0, "requested_bytes.all.current": 1000,
        "reserved_bytes.all.current": 2097152, "reserved_bytes.small_pool.current": 2097152,
        "segment.small_pool.current": 1, "allocation.all.current": 1, "active_bytes.all.current": 1024,
        "inactive_split.small_pool.current": 1, "inactive_split_bytes.small_pool.current": 2096128,
        "num_device_alloc": 1, "num_device_free": 0,
    }
    for key, want in expected.items():
        check_eq(after.get(key), want, f"after malloc(1000): {key}")
    v = ctypes.c_int64()
    for fn, want in (("accalloc_memory_allocated", 1024), ("accalloc_max_memory_allocated", 1024),
                     ("accalloc_memory_reserved", 2097152), ("accalloc_max_memory_reserved", 2097152)):
        check_eq(getattr(lib, fn)(0, ctypes.byref(v)), ACCALLOC_OK, fn)
        check_eq(v.value, want, fn)
    free_b, total_b = ctypes.c_uint64(), ctypes.c_uint64()
    check_eq(lib.accalloc_mem_get_info(0, ctypes.byref(free_b), ctypes.byref(total_b)), ACCALLOC_OK,
             "accalloc_mem_get_info")
    check_eq(total_b.value, GIB, "total = ACCALLOC_HOST_CAPACITY")
    check_eq(free_b.value, GIB - 2097152, "free = total - reserved")

    # --- free, errors on that pointer ---
    check_eq(lib.accalloc_record_stream(p, None), ACCALLOC_OK, "record_stream on its own stream (ignored)")
    check_eq(lib.accalloc_free(p), ACCALLOC_OK, "accalloc_free")
    check_eq(lib.accalloc_record_stream(p, ctypes.c_void_p(0x3000)), ACCALLOC_ERROR_INVALID_POINTER,
             "record_stream, freed")
    check_eq(lib.accalloc_free(p), ACCALLOC_ERROR_INVALID_POINTER, "double free")
    check(len(last_error()) > 0, "double free has a message")
    check_eq(lib.accalloc_free(ctypes.c_void_p(p.value + 512)), ACCALLOC_ERROR_INVALID_POINTER, "interior pointer")
    check_eq(lib.accalloc_free(None), ACCALLOC_OK, "accalloc_free(NULL)")
    after_free = check_consistency(0, "after free")
    check_eq(after_free["allocated_bytes.all.current"], 0, "allocated after free")
    check_eq(after_free["allocated_bytes.all.peak"], 1024, "peak after free")
    check_eq(after_free["reserved_bytes.all.current"], 2097152, "the segment stays cached")
    check_eq(after_free["inactive_split.all.current"], 0, "merged back into a whole segment")

    check_eq(lib.accalloc_empty_cache(), ACCALLOC_OK, "accalloc_empty_cache")
    emptied = check_consistency(0, "after empty_cache")
    check_eq(emptied["reserved_bytes.all.current"], 0, "reserved after empty_cache")
    check_eq(emptied["num_device_free"], 1, "num_device_free")
    check_eq(emptied["num_sync_all_streams"], 1, "num_sync_all_streams")

    check_eq(lib.accalloc_reset_peak_memory_stats(0), ACCALLOC_OK, "reset peak")
    check_eq(stat(0, "allocated_bytes.all.peak"), 0, "peak after reset")
    check_eq(lib.accalloc_reset_accumulated_memory_stats(0), ACCALLOC_OK, "reset accumulated")
    check_eq(stat(0, "allocated_bytes.all.allocated"), 0, "accumulated after reset")
    check_eq(stat(0, "num_device_free"), 0, "counter after reset")

    # --- OOM ---
    q = ctypes.c_void_p()
    before = device_stats(0)
    check_eq(lib.accalloc_malloc(ctypes.byref(q), 1 << 40, 0, None), ACCALLOC_ERROR_OUT_OF_MEMORY, "1 TiB")
    check("Tried to allocate 1024.00 GiB" in last_error(), f"OOM message: {last_error()!r}")
    after = device_stats(0)
    check_eq(after["num_ooms"], before["num_ooms"] + 1, "a request larger than the device is an OOM")
    check_eq({**after, "num_ooms": before["num_ooms"]}, before,
             "a request larger than the device changes nothing but num_ooms")
    # 300 MiB is within the device, but not within a 0.25 fraction (256 MiB): a counted OOM
    check_eq(lib.accalloc_set_memory_fraction(0.25, 0), ACCALLOC_OK, "fraction 0.25")
    check_eq(lib.accalloc_malloc(ctypes.byref(q), 300 << 20, 0, None), ACCALLOC_ERROR_OUT_OF_MEMORY,
             "300 MiB over 0.25")
    check("Tried to allocate 300.00 MiB" in last_error(), f"OOM message: {last_error()!r}")
    check_eq(stat(0, "num_ooms"), 2, "num_ooms (with the 1 TiB request)")
    check_eq(stat(0, "num_alloc_retries"), 1, "num_alloc_retries")
    check_eq(stat(0, "allocation.all.allocated"), 0, "nothing handed out by the OOM")
    check_eq(lib.accalloc_set_memory_fraction(1.0, 0), ACCALLOC_OK, "fraction 1.0")

    # --- errors ---
    check_eq(lib.accalloc_malloc(None, 16, 0, None), ACCALLOC_ERROR_INVALID_ARGUMENT, "malloc NULL out")
    check_eq(lib.accalloc_malloc(ctypes.byref(q), 16, 2, None), ACCALLOC_ERROR_INVALID_DEVICE, "malloc device 2")
    check_eq(lib.accalloc_malloc(ctypes.byref(q), 16, -2, None), ACCALLOC_ERROR_INVALID_DEVICE, "malloc device -2")
    check_eq(lib.accalloc_memory_stat(0, b"allocated.all.current", ctypes.byref(v)), ACCALLOC_ERROR_INVALID_ARGUMENT,
             "the docstring's 'allocated' is not a key")
    check_eq(lib.accalloc_memory_stat(0, None, ctypes.byref(v)), ACCALLOC_ERROR_INVALID_ARGUMENT, "NULL key")
    check_eq(lib.accalloc_memory_stat(0, b"num_ooms", None), ACCALLOC_ERROR_INVALID_ARGUMENT, "NULL out")
    check_eq(lib.accalloc_memory_stat(3, b"num_ooms", ctypes.byref(v)), ACCALLOC_ERROR_INVALID_DEVICE, "stat device 3")
    check_eq(lib.accalloc_memory_stats_json(0, None, 0, None), ACCALLOC_ERROR_INVALID_ARGUMENT, "json NULL len")
    check_eq(lib.accalloc_get_device_stats(0, None), ACCALLOC_ERROR_INVALID_ARGUMENT, "stats NULL")
    zero = AccallocDeviceStats()
    check_eq(lib.accalloc_get_device_stats(0, ctypes.byref(zero)), ACCALLOC_ERROR_INVALID_ARGUMENT, "struct_size 0")
    for bad in (-0.5, 1.5, math.nan, math.inf):
        check_eq(lib.accalloc_set_memory_fraction(bad, 0), ACCALLOC_ERROR_INVALID_ARGUMENT, f"fraction {bad}")
    check_eq(lib.accalloc_set_memory_fraction(0.5, 9), ACCALLOC_ERROR_INVALID_DEVICE, "fraction device 9")
    check_eq(lib.accalloc_set_device(2), ACCALLOC_ERROR_INVALID_DEVICE, "set_device(2)")
    check_eq(lib.accalloc_device_count(None), ACCALLOC_ERROR_INVALID_ARGUMENT, "device_count NULL")
    check_eq(lib.accalloc_mem_get_info(0, None, ctypes.byref(total_b)), ACCALLOC_ERROR_INVALID_ARGUMENT,
             "mem_get_info NULL")
    check_eq(lib.accalloc_reset_peak_memory_stats(-5), ACCALLOC_ERROR_INVALID_DEVICE, "reset peak device -5")
    check_eq(stat(0, "allocation.all.allocated"), 0, "the failures allocated nothing")
    check_eq(stat(0, "num_ooms"), 2, "argument errors are not OOMs")

    # device 1, selected per thread
    check_eq(lib.accalloc_set_device(1), ACCALLOC_OK, "set_device(1)")
    check_eq(lib.accalloc_malloc(ctypes.byref(q), 3 << 20, -1, None), ACCALLOC_OK, "malloc(3 MiB) on device 1")
    dev1 = check_consistency(1, "device 1 with a 3 MiB block")
    check_eq(dev1["allocated_bytes.large_pool.current"], 3 << 20, "3 MiB in the large pool")
    check_eq(dev1["reserved_bytes.large_pool.current"], 20 << 20, "one 20 MiB large segment")
    check_eq(dev1["inactive_split_bytes.large_pool.current"], 17 << 20, "17 MiB left")
    check_eq(lib.accalloc_free(q), ACCALLOC_OK, "free the 3 MiB block")
    check_eq(lib.accalloc_set_device(0), ACCALLOC_OK, "set_device(0)")

    # allocator settings
    def get_settings():
        need = ctypes.c_size_t(0)
        check_eq(lib.accalloc_get_allocator_settings(None, 0, ctypes.byref(need)), ACCALLOC_OK, "settings size query")
        buf = ctypes.create_string_buffer(need.value)
        check_eq(lib.accalloc_get_allocator_settings(buf, need.value, ctypes.byref(need)), ACCALLOC_OK, "settings")
        return buf.value.decode()

    check_eq(get_settings(), "", "default settings")
    check_eq(lib.accalloc_set_allocator_settings(b"max_split_size_mb:128"), ACCALLOC_OK, "max_split_size_mb:128")
    check_eq(stat(0, "max_split_size"), 128 << 20, "max_split_size after setting it")
    check_eq(stat(1, "max_split_size"), 128 << 20, "max_split_size on device 1 too")
    check("max_split_size_mb:128" in get_settings(), f"settings read back: {get_settings()!r}")
    check_eq(lib.accalloc_set_allocator_settings(b"max_split_size_mb:1"), ACCALLOC_ERROR_CONFIG, "max_split_size_mb:1")
    check("max_split_size_mb" in last_error(), f"config message names the key: {last_error()!r}")
    check("max_split_size_mb:128" in get_settings(), "a refused setting changes nothing")
    check_eq(lib.accalloc_set_allocator_settings(b""), ACCALLOC_OK, "back to defaults")
    check_eq(get_settings(), "", "defaults again")
    check_eq(stat(0, "max_split_size"), -1, "max_split_size unset again")

    # --- snapshot: segments and blocks agree with the statistics; the event history ---
    def snapshot():
        need = ctypes.c_size_t(0)
        check_eq(lib.accalloc_memory_snapshot_json(None, 0, ctypes.byref(need)), ACCALLOC_OK, "snapshot size query")
        buf = ctypes.create_string_buffer(need.value)
        check_eq(lib.accalloc_memory_snapshot_json(buf, need.value, ctypes.byref(need)), ACCALLOC_OK, "snapshot")
        return json.loads(buf.value.decode())

    def check_snapshot(where):
        snap = snapshot()
        check(set(snap) >= {"segments", "device_traces", "allocator_settings"}, f"[{where}] snapshot keys {set(snap)}")
        check_eq(len(snap["device_traces"]), 2, f"[{where}] one trace list per device")
        for device in (0, 1):
            segs = [s for s in snap["segments"] if s["device"] == device]
            st = device_stats(device)
            addrs = [s["address"] for s in segs]
            check_eq(addrs, sorted(addrs), f"[{where}] device {device} segments in address order")
            check_eq(len(segs), st["segment.all.current"], f"[{where}] device {device} segments")
            for pool, kind in (("small_pool", "small"), ("large_pool", "large")):
                check_eq(sum(1 for s in segs if s["segment_type"] == kind), st[f"segment.{pool}.current"],
                         f"[{where}] device {device} {kind} segments")
                check_eq(sum(s["total_size"] for s in segs if s["segment_type"] == kind),
                         st[f"reserved_bytes.{pool}.current"], f"[{where}] device {device} {kind} reserved")
            check_eq(sum(s["allocated_size"] for s in segs), st["allocated_bytes.all.current"],
                     f"[{where}] device {device} allocated_size")
            check_eq(sum(s["active_size"] for s in segs), st["active_bytes.all.current"],
                     f"[{where}] device {device} active_size")
            check_eq(sum(s["requested_size"] for s in segs), st["requested_bytes.all.current"],
                     f"[{where}] device {device} requested_size")
            blocks = [b for s in segs for b in s["blocks"]]
            check_eq(sum(1 for b in blocks if b["state"] == "active_allocated"), st["allocation.all.current"],
                     f"[{where}] device {device} active_allocated blocks")
            check_eq(sum(1 for b in blocks if b["state"] != "inactive"), st["active.all.current"],
                     f"[{where}] device {device} active blocks")
            split_free = [b for s in segs if len(s["blocks"]) > 1 for b in s["blocks"] if b["state"] == "inactive"]
            check_eq(len(split_free), st["inactive_split.all.current"], f"[{where}] device {device} inactive_split")
            check_eq(sum(b["size"] for b in split_free), st["inactive_split_bytes.all.current"],
                     f"[{where}] device {device} inactive_split_bytes")
            for s in segs:
                check(s["is_expandable"] is False, f"[{where}] not expandable")
                check_eq(sum(b["size"] for b in s["blocks"]), s["total_size"], f"[{where}] blocks fill the segment")
                check_eq(s["blocks"][0]["address"], s["address"], f"[{where}] first block at the segment start")
                for x, y in zip(s["blocks"], s["blocks"][1:]):
                    check_eq(y["address"], x["address"] + x["size"], f"[{where}] blocks are contiguous")
                check_eq(s["allocated_size"], sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated"),
                         f"[{where}] segment allocated_size")
                check_eq(s["active_size"], sum(b["size"] for b in s["blocks"] if b["state"] != "inactive"),
                         f"[{where}] segment active_size")
        return snap

    check_eq(lib.accalloc_empty_cache(), ACCALLOC_OK, "empty_cache before the snapshot checks")
    check_eq(lib.accalloc_record_memory_history(1, 0), ACCALLOC_ERROR_INVALID_ARGUMENT, "history with max_entries 0")
    check_eq(lib.accalloc_record_memory_history(1, 100), ACCALLOC_OK, "start the history")
    snap = check_snapshot("empty")
    check_eq(snap["segments"], [], "no segments after empty_cache")
    check_eq(snap["device_traces"], [[], []], "history just started: empty")

    a, b, c = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    check_eq(lib.accalloc_malloc(ctypes.byref(a), 1000, 1, None), ACCALLOC_OK, "malloc(1000) on device 1")
    check_eq(lib.accalloc_malloc(ctypes.byref(b), 3 << 20, 1, None), ACCALLOC_OK, "malloc(3 MiB) on device 1")
    check_eq(lib.accalloc_malloc(ctypes.byref(c), 5000, 0, None), ACCALLOC_OK, "malloc(5000) on device 0")
    snap = check_snapshot("three live blocks")
    small = [s for s in snap["segments"] if s["device"] == 1 and s["segment_type"] == "small"]
    check_eq(len(small), 1, "one small segment on device 1")
    if small:
        seg = small[0]
        check_eq(seg["total_size"], 2097152, "small segment size")
        check_eq(seg["address"], a.value, "the block is at the segment start")
        check_eq(seg["stream"], 0, "default stream")
        check_eq([(x["size"], x["state"]) for x in seg["blocks"]],
                 [(1024, "active_allocated"), (2096128, "inactive")], "small segment blocks")
        check_eq(seg["blocks"][0]["requested_size"], 1000, "requested_size of the live block")
        check_eq((seg["allocated_size"], seg["active_size"], seg["requested_size"]), (1024, 1024, 1000),
                 "small segment totals")

    # a freed block waiting on another stream is active_pending_free
    check_eq(lib.accalloc_record_stream(b, other_stream(1)), ACCALLOC_OK, "record_stream")
    check_eq(lib.accalloc_free(b), ACCALLOC_OK, "free with a recorded stream")
    snap = check_snapshot("pending free")
    states = [x["state"] for s in snap["segments"] if s["device"] == 1 and s["segment_type"] == "large"
              for x in s["blocks"]]
    check_eq(states, ["active_pending_free", "inactive"], "the 3 MiB block waits on the other stream")
    check_eq(lib.accalloc_free(a), ACCALLOC_OK, "free(1000)")
    check_eq(lib.accalloc_free(c), ACCALLOC_OK, "free(5000)")
    check_eq(lib.accalloc_empty_cache(), ACCALLOC_OK, "empty_cache")
    snap = check_snapshot("after empty_cache")
    check_eq(snap["segments"], [], "everything released")

    # the history of device 1, in order, with PyTorch's sizes: segments by their size, blocks by the size
    # the caller asked for (PyTorch's record_trace passes orig_size / requested_size)
    t1 = snap["device_traces"][1]
    acts = [e["action"] for e in t1]
    check_eq(acts[:4], ["segment_alloc", "alloc", "segment_alloc", "alloc"], "device 1 trace: two mallocs")
    check_eq(sorted(acts[4:]), sorted(["free_requested", "free_requested", "free_completed", "free_completed",
                                       "segment_free", "segment_free"]), "device 1 trace: frees and releases")
    check(all(x["time_us"] <= y["time_us"] for x, y in zip(t1, t1[1:])), "trace times never go back")
    check(all(e["stream"] == 0 for e in t1), "trace streams: default")
    by = {}
    for e in t1:
        by.setdefault((e["action"], e["addr"]), []).append(e["size"])
    check_eq(by.get(("segment_alloc", a.value)), [2097152], "trace: small segment_alloc size")
    check_eq(by.get(("segment_free", a.value)), [2097152], "trace: small segment_free size")
    check_eq(by.get(("alloc", a.value)), [1000], "trace: alloc of 1000 bytes records the size asked for")
    check_eq(by.get(("free_requested", a.value)), [1000], "trace: free_requested size")
    check_eq(by.get(("free_completed", a.value)), [1000], "trace: free_completed size")
    check_eq(by.get(("alloc", b.value)), [3 << 20], "trace: alloc of 3 MiB")
    check_eq(by.get(("segment_alloc", b.value)), [20 << 20], "trace: large segment_alloc size")
    # free_completed of the pending block comes after its free_requested (it waited for the stream)
    order = [(e["action"], e["addr"]) for e in t1]
    if ("free_requested", b.value) in order and ("free_completed", b.value) in order:
        check(order.index(("free_requested", b.value)) < order.index(("free_completed", b.value)),
              "pending free completes after it was requested")
    t0 = snap["device_traces"][0]
    check_eq([e["action"] for e in t0], ["segment_alloc", "alloc", "free_requested", "free_completed",
                                         "segment_free"], "device 0 trace")

    # an OOM is recorded too
    check_eq(lib.accalloc_set_memory_fraction(0.0, 1), ACCALLOC_OK, "fraction 0")
    check_eq(lib.accalloc_malloc(ctypes.byref(a), 1000, 1, None), ACCALLOC_ERROR_OUT_OF_MEMORY, "OOM under fraction 0")
    check_eq(lib.accalloc_set_memory_fraction(1.0, 1), ACCALLOC_OK, "fraction 1")
    check_eq(snapshot()["device_traces"][1][-1]["action"], "oom", "the OOM is in the history")

    # max_entries keeps the newest entries; restarting clears; stopping stops
    check_eq(lib.accalloc_record_memory_history(1, 3), ACCALLOC_OK, "restart with 3 entries")
    check_eq(snapshot()["device_traces"], [[], []], "restarting clears the history")
    for _ in range(2):
        check_eq(lib.accalloc_malloc(ctypes.byref(a), 1000, 1, None), ACCALLOC_OK, "malloc")
        check_eq(lib.accalloc_free(a), ACCALLOC_OK, "free")
    t1 = snapshot()["device_traces"][1]
    # 2 x (malloc, free) = segment_alloc, alloc, free_requested, free_completed, alloc, free_requested,
    # free_completed: the newest 3 remain
    check_eq([e["action"] for e in t1], ["alloc", "free_requested", "free_completed"],
             "only the newest 3 entries are kept, oldest first")
    check_eq(lib.accalloc_record_memory_history(0, 0), ACCALLOC_OK, "stop the history")
    n_before = [len(t) for t in snapshot()["device_traces"]]
    check_eq(lib.accalloc_malloc(ctypes.byref(a), 1000, 1, None), ACCALLOC_OK, "malloc after stopping")
    check_eq(lib.accalloc_free(a), ACCALLOC_OK, "free after stopping")
    check_eq([len(t) for t in snapshot()["device_traces"]], n_before, "nothing recorded after stopping")
    check_eq(lib.accalloc_empty_cache(), ACCALLOC_OK, "empty_cache")

    # --- memory_summary: the PyTorch table ---
    need = ctypes.c_size_t(0)
    check_eq(lib.accalloc_memory_summary(0, 0, None, 0, ctypes.byref(need)), ACCALLOC_OK, "summary size query")
    buf = ctypes.create_string_buffer(need.value)
    check_eq(lib.accalloc_memory_summary(0, 0, buf, need.value, ctypes.byref(need)), ACCALLOC_OK, "summary")
    lines = buf.value.decode().splitlines()
    check(len(lines) > 40, f"summary has {len(lines)} lines")
    check(all(len(line) == 77 and line[0] == "|" and line[-1] == "|" for line in lines),
          "summary lines are 77 characters between bars")
    check_eq(lib.accalloc_memory_summary(0, 0, None, 0, None), ACCALLOC_ERROR_INVALID_ARGUMENT, "summary NULL len")

    print(f"test_ctypes: {checks} checks, {failures} failed")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
