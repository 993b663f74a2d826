"""The package's ctypes mirror of AccallocDeviceStats, read from the installed accalloc.h, against the
library's table of statistics (the 122 keys of memory_stats, which accalloc generates from it)."""
import ctypes

import accalloc
from accalloc import _library
from conftest import MiB


def flatten(stats):
    """memory_stats()'s keys and values from a DeviceStats, by the mirror's own lists."""
    fields = [name for name, _ in _library.Stat._fields_]
    out = {}
    for family in _library.FAMILIES:
        for pool, stat in zip(("all", "small_pool", "large_pool"), getattr(stats, family)):
            out.update({f"{family}.{pool}.{field}": getattr(stat, field) for field in fields})
    for family in _library.SINGLE_FAMILIES:
        out.update({f"{family}.{field}": getattr(getattr(stats, family), field) for field in fields})
    out.update({name: getattr(stats, name) for name in _library.SCALARS})
    return out


def test_device_stats_mirror_every_statistic_of_memory_stats(fresh_device):
    lib = _library.library()
    ptr = ctypes.c_void_p()
    accalloc.check(lib.accalloc_malloc_on(0, ctypes.byref(ptr), 3 * MiB, 0, None))
    try:
        stats = accalloc.device_stats("host:0")
        assert stats.struct_size == ctypes.sizeof(_library.DeviceStats)
        flat = flatten(stats)
        assert flat == accalloc.memory_stats("host:0")
        assert flat["allocated_bytes.all.current"] == 3 * MiB and len(flat) == 122
    finally:
        accalloc.check(lib.accalloc_free(ptr))
