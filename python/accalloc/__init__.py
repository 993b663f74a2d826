"""accalloc from Python: the caching allocator's memory API under torch.accelerator's names.

    import accalloc
    accalloc.memory_stats()          # the 122 statistics, sorted by key, as torch.accelerator's
    accalloc.max_memory_allocated(0)
    accalloc.empty_cache()

Every function works over accalloc's C ABI (ctypes), with or without PyTorch. `device` is what
torch.accelerator takes: None (this thread's current device), an index, "accalloc:1" / "cuda:0", or a
torch.device. "host" is accalloc's host backend, "cuda" its CUDA backend, the name accalloc.torch registered the
accelerator under its device type; an index alone means accalloc's current accelerator. PyTorch's own
integration is in accalloc.torch.
"""
import ctypes
import importlib.metadata
import json
import sys

from ._library import (ABI_VERSION, ACCALLOC_ERROR_BUFFER_TOO_SMALL, DEVICE_CUDA, DEVICE_HOST, AccallocError,
                       DeviceStats, PlannerStats, check, library, library_path)

# One place for the version: the workspace Cargo.toml, which setup.py gave the installed package.
__version__ = importlib.metadata.version("accalloc")
__all__ = [
    "AccallocError", "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "memory_summary", "get_memory_info", "device_count", "current_device", "set_device",
    "set_allocator_settings", "get_allocator_settings", "set_per_process_memory_fraction",
    "current_accelerator", "library_path", "host_memory_stats", "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats", "empty_host_cache", "host_malloc", "host_free", "is_pinned",
    "planner_stats", "memory_snapshot", "record_memory_history", "get_per_process_memory_fraction",
]

# Device type names and the accalloc device types they mean; accalloc.torch adds the name it registers.
_DEVICE_TYPES = {"host": DEVICE_HOST, "cuda": DEVICE_CUDA}


def _device_type_and_index(device):
    """(accalloc device type, index; -1 for the current device) of torch.accelerator's `device`."""
    if device is None:
        return library().accalloc_current_accelerator(), -1
    if isinstance(device, int):
        return library().accalloc_current_accelerator(), device
    if isinstance(device, str):
        name, _, index = device.partition(":")
        index = int(index) if index else -1
    else:  # torch.device, or anything with .type and .index
        name, index = device.type, (-1 if device.index is None else device.index)
    if name in _DEVICE_TYPES:
        return _DEVICE_TYPES[name], index
    raise ValueError(f"accalloc serves no device of type {name!r} (known: {', '.join(sorted(_DEVICE_TYPES))})")


def _int64(function, device):
    device_type, index = _device_type_and_index(device)
    value = ctypes.c_int64()
    check(getattr(library(), function)(device_type, index, ctypes.byref(value)))
    return value.value


def _text(function, *args):
    """The text a sized-buffer call writes: asked for its length, then written. Another thread may
    allocate in between and the text grow (a snapshot, the statistics): the call then says the buffer
    is too small, with the new length, and is made again."""
    needed = ctypes.c_size_t()
    check(function(*args, None, 0, ctypes.byref(needed)))
    while True:
        buffer = ctypes.create_string_buffer(needed.value)
        status = function(*args, buffer, needed.value, ctypes.byref(needed))
        if status != ACCALLOC_ERROR_BUFFER_TOO_SMALL:
            check(status)
            return buffer.value.decode()


def memory_stats(device=None):
    """All 122 statistics of PyTorch's memory_stats(), sorted by key (torch.accelerator's names)."""
    device_type, index = _device_type_and_index(device)
    return json.loads(_text(library().accalloc_memory_stats_json_on, device_type, index))


def device_stats(device=None):
    """The same statistics as accalloc's AccallocDeviceStats struct (fields as in accalloc.h)."""
    device_type, index = _device_type_and_index(device)
    stats = DeviceStats()
    stats.struct_size = ctypes.sizeof(DeviceStats)
    check(library().accalloc_get_device_stats_on(device_type, index, ctypes.byref(stats)))
    return stats


def planner_stats(device=None):
    """What planned_placement's planner has done on `device` (ACCALLOC_CONF=planned_placement:True): a dict
    of accalloc.h's AccallocPlannerStats (in_force a bool; plans, attempts, dropped, advised, conflicts,
    plan_height, from_parked and plan_floor ints; a library older than its header leaves out what it does
    not know), or None where the setting is off."""
    device_type, index = _device_type_and_index(device)
    stats = PlannerStats()
    stats.struct_size = ctypes.sizeof(PlannerStats)
    check(library().accalloc_planner_stats_on(device_type, index, ctypes.byref(stats)))
    if not stats.enabled:
        return None
    # A library older than the header fills fewer bytes (it says how many in struct_size): the fields it
    # did not fill are left out, not reported as zeros.
    filled = [name for name, _ in PlannerStats._fields_
              if getattr(PlannerStats, name).offset + getattr(PlannerStats, name).size <= stats.struct_size]
    values = {name: getattr(stats, name) for name in filled if name not in ("struct_size", "enabled")}
    values["in_force"] = bool(values["in_force"])
    return values


def memory_allocated(device=None):
    """Bytes handed out and not yet freed ("allocated_bytes.all.current")."""
    return _int64("accalloc_memory_allocated_on", device)


def max_memory_allocated(device=None):
    """The peak of memory_allocated since the last reset_peak_memory_stats ("allocated_bytes.all.peak")."""
    return _int64("accalloc_max_memory_allocated_on", device)


def memory_reserved(device=None):
    """Bytes held from the device, cached or handed out ("reserved_bytes.all.current")."""
    return _int64("accalloc_memory_reserved_on", device)


def max_memory_reserved(device=None):
    """The peak of memory_reserved since the last reset_peak_memory_stats ("reserved_bytes.all.peak")."""
    return _int64("accalloc_max_memory_reserved_on", device)


def reset_accumulated_memory_stats(device=None):
    """Zero the counts of allocations and frees ("*.allocated", "*.freed", retries, OOMs, device calls)."""
    device_type, index = _device_type_and_index(device)
    check(library().accalloc_reset_accumulated_memory_stats_on(device_type, index))


def reset_peak_memory_stats(device=None):
    """Set every peak to its current value."""
    device_type, index = _device_type_and_index(device)
    check(library().accalloc_reset_peak_memory_stats_on(device_type, index))


def empty_cache(device=None):
    """Give every cached, unused segment back to the device (of `device`'s type; all of them for None)."""
    if device is None:
        check(library().accalloc_empty_cache())
    else:
        check(library().accalloc_empty_cache_on(_device_type_and_index(device)[0]))


def get_memory_info(device=None):
    """(free, total) bytes of the device, as torch.accelerator.get_memory_info() returns them."""
    device_type, index = _device_type_and_index(device)
    free, total = ctypes.c_uint64(), ctypes.c_uint64()
    check(library().accalloc_mem_get_info_on(device_type, index, ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


def memory_summary(device=None, abbreviated=False):
    """PyTorch's memory_summary() table for the device."""
    device_type, index = _device_type_and_index(device)
    return _text(library().accalloc_memory_summary_on, device_type, index, int(bool(abbreviated)))


def memory_snapshot(device_type=None):
    """Every device's segments and blocks of an accelerator (default: the current one), as
    torch.cuda.memory._snapshot() gives them: a dict with "segments" (each with its "blocks"),
    "device_traces" (the history, where accalloc_record_memory_history turned it on) and
    "allocator_settings". accalloc's own keys appear only where they say something: "paused_size" on a
    segment with paused pages, "planned_range" ([start, end)) on each segment a plan in force spans
    (planned_placement)."""
    return json.loads(_text(library().accalloc_memory_snapshot_json_on, _device_type(device_type)))


def record_memory_history(enabled=True, max_entries=sys.maxsize, device_type=None):
    """Start (`enabled`) or stop recording the history of an accelerator's allocator events (default:
    the current accelerator), keeping the newest `max_entries` per device: alloc, free_requested,
    free_completed, segment_alloc, segment_free, segment_map, segment_unmap and oom, with their
    addresses, sizes, streams and microsecond times, in memory_snapshot()'s "device_traces". Starting
    clears what was recorded before."""
    if not isinstance(max_entries, int) or isinstance(max_entries, bool):
        raise TypeError(f"max_entries must be an int, not {type(max_entries).__name__}")
    if enabled and max_entries < 1:
        raise ValueError(f"max_entries must be 1 or more to record, not {max_entries}")
    entries = min(max_entries, ctypes.c_size_t(-1).value) if enabled else 0
    check(library().accalloc_record_memory_history_on(_device_type(device_type), int(bool(enabled)), entries))


def host_memory_stats(device_type=None):
    """The pinned host memory statistics of an accelerator's host caching allocator (default: the current
    accelerator), sorted by key, as torch.cuda.host_memory_stats() gives them: allocations,
    allocated_bytes, active_requests, active_bytes (.current/.peak/.allocated/.freed), num_host_alloc,
    num_host_free, host_alloc_time and host_free_time (.total/.max/.min/.count/.avg, microseconds), and
    accalloc's page_locked_bytes."""
    return json.loads(_text(library().accalloc_host_memory_stats_json_on, _device_type(device_type)))


def reset_accumulated_host_memory_stats(device_type=None):
    """Zero the running totals of the pinned host statistics (.allocated, .freed, num_host_*, timings)."""
    check(library().accalloc_host_reset_accumulated_memory_stats_on(_device_type(device_type)))


def reset_peak_host_memory_stats(device_type=None):
    """Set every peak of the pinned host statistics to its current value."""
    check(library().accalloc_host_reset_peak_memory_stats_on(_device_type(device_type)))


def empty_host_cache(device_type=None):
    """Give the cached pinned host blocks whose streams have finished back to the system."""
    check(library().accalloc_host_empty_cache_on(_device_type(device_type)))


def host_malloc(size, device_type=None):
    """Pinned host memory of at least `size` bytes (rounded up to a power of two) as an address; give it
    back with host_free. 0 for size 0."""
    out = ctypes.c_void_p()
    check(library().accalloc_host_malloc_on(_device_type(device_type), ctypes.byref(out), size))
    return out.value or 0


def host_free(address):
    """Give back pinned host memory from host_malloc (of any accelerator)."""
    check(library().accalloc_host_free(address))


def is_pinned(address):
    """Whether `address` lies in pinned host memory from accalloc (handed out or cached)."""
    out = ctypes.c_bool()
    check(library().accalloc_host_is_pinned(address, ctypes.byref(out)))
    return out.value


def _device_type(device_type):
    if device_type is None:
        return library().accalloc_current_accelerator()
    return _device_type_and_index(f"{device_type}:0")[0]


def device_count(device_type=None):
    """How many devices accalloc's current accelerator (or `device_type`: "host", "cuda") has."""
    count = ctypes.c_int32()
    check(library().accalloc_device_count_on(_device_type(device_type), ctypes.byref(count)))
    return count.value


def current_device(device_type=None):
    """This thread's current device index."""
    index = ctypes.c_int32()
    check(library().accalloc_current_device_on(_device_type(device_type), ctypes.byref(index)))
    return index.value


def set_device(device):
    """Make `device` this thread's current device (of its type)."""
    device_type, index = _device_type_and_index(device)
    check(library().accalloc_set_device_on(device_type, index))


def set_allocator_settings(settings, device_type=None):
    """Change the settings at run time, in PYTORCH_ALLOC_CONF's syntax ("expandable_segments:True,...")."""
    check(library().accalloc_set_allocator_settings_on(_device_type(device_type), settings.encode()))


def get_allocator_settings(device_type=None):
    """The settings in force, as a settings string."""
    return _text(library().accalloc_get_allocator_settings_on, _device_type(device_type))


def set_per_process_memory_fraction(fraction, device=None):
    """Cap reserved memory at `fraction` (0 to 1) of the device."""
    device_type, index = _device_type_and_index(device)
    check(library().accalloc_set_memory_fraction_on(device_type, float(fraction), index))


def get_per_process_memory_fraction(device=None):
    """The fraction of the device's memory reserved memory is capped at (1.0 when none is set), as
    torch.cuda.get_per_process_memory_fraction() reports it: the bytes allowed over the total."""
    device_type, index = _device_type_and_index(device)
    fraction = ctypes.c_double()
    check(library().accalloc_get_memory_fraction_on(device_type, ctypes.byref(fraction), index))
    return fraction.value


def current_accelerator():
    """The name of accalloc's current accelerator: "cuda" with a GPU, else "host"."""
    lib = library()
    return lib.accalloc_device_type_name(lib.accalloc_current_accelerator()).decode()


# The ABI of the header installed with the package (the one these declarations follow): a library of
# another ABI is refused at import, with both numbers.
check(library().accalloc_check_abi(ABI_VERSION))
