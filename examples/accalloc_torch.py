"""accalloc from Python: its statistics under torch.accelerator's names, and accalloc as PyTorch's
CUDA allocator.

PyTorch cannot report memory_stats() for a pluggable allocator, so this module reads accalloc's own
through ctypes:

    import accalloc_torch as acc
    acc.use_as_pytorch_allocator()        # before the first CUDA tensor
    ...train...
    print(acc.max_memory_reserved(), acc.memory_stats()["num_alloc_retries"])
    print(acc.memory_summary())

Without PyTorch (or without a GPU) the statistics functions still work on accalloc's current
accelerator; `python3 examples/accalloc_torch.py` runs a short self-check on it.
"""
import ctypes
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIBRARY = os.path.join(_HERE, "..", "target", "release", "libaccalloc.so")

_lib = None


def library(path=None):
    """Load libaccalloc.so once (ACCALLOC_LIBRARY or the release build by default)."""
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(path or os.environ.get("ACCALLOC_LIBRARY", DEFAULT_LIBRARY))
        _lib.accalloc_last_error_message.restype = ctypes.c_char_p
        _lib.accalloc_status_name.restype = ctypes.c_char_p
        _lib.accalloc_status_name.argtypes = [ctypes.c_int32]
        _lib.accalloc_device_type_name.restype = ctypes.c_char_p
        _lib.accalloc_device_type_name.argtypes = [ctypes.c_int32]
        _lib.accalloc_current_accelerator.restype = ctypes.c_int32
        for name in ("accalloc_memory_allocated", "accalloc_max_memory_allocated", "accalloc_memory_reserved", "accalloc_max_memory_reserved"):
            getattr(_lib, name).argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]
        _lib.accalloc_memory_stats_json.argtypes = [ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        _lib.accalloc_memory_summary.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        _lib.accalloc_mem_get_info.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
        for name in ("accalloc_reset_accumulated_memory_stats", "accalloc_reset_peak_memory_stats"):
            getattr(_lib, name).argtypes = [ctypes.c_int32]
    return _lib


class AccallocError(RuntimeError):
    pass


def _check(status):
    if status != 0:
        lib = library()
        raise AccallocError(f"{lib.accalloc_status_name(status).decode()}: {lib.accalloc_last_error_message().decode()}")


def _device(device):
    """torch.accelerator's convention: None means the current device (-1 for accalloc)."""
    if device is None:
        return -1
    return getattr(device, "index", device) if getattr(device, "index", device) is not None else -1


def _int64(name, device):
    value = ctypes.c_int64()
    _check(getattr(library(), name)(_device(device), ctypes.byref(value)))
    return value.value


def _text(function, *args):
    needed = ctypes.c_size_t()
    _check(function(*args, None, 0, ctypes.byref(needed)))
    buffer = ctypes.create_string_buffer(needed.value)
    _check(function(*args, buffer, needed.value, ctypes.byref(needed)))
    return buffer.value.decode()


def memory_stats(device=None):
    """All 122 statistics, sorted by key, as torch.accelerator.memory_stats() returns them."""
    return json.loads(_text(library().accalloc_memory_stats_json, _device(device)))


def memory_allocated(device=None):
    return _int64("accalloc_memory_allocated", device)


def max_memory_allocated(device=None):
    return _int64("accalloc_max_memory_allocated", device)


def memory_reserved(device=None):
    return _int64("accalloc_memory_reserved", device)


def max_memory_reserved(device=None):
    return _int64("accalloc_max_memory_reserved", device)


def reset_accumulated_memory_stats(device=None):
    _check(library().accalloc_reset_accumulated_memory_stats(_device(device)))


def reset_peak_memory_stats(device=None):
    _check(library().accalloc_reset_peak_memory_stats(_device(device)))


def empty_cache():
    _check(library().accalloc_empty_cache())


def get_memory_info(device=None):
    """(free, total) bytes of the device."""
    free, total = ctypes.c_uint64(), ctypes.c_uint64()
    _check(library().accalloc_mem_get_info(_device(device), ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


def memory_summary(device=None, abbreviated=False):
    return _text(library().accalloc_memory_summary, _device(device), int(abbreviated))


def use_as_pytorch_allocator(path=None):
    """Make accalloc PyTorch's CUDA allocator (call before the first CUDA allocation)."""
    import torch

    path = os.path.abspath(path or os.environ.get("ACCALLOC_LIBRARY", DEFAULT_LIBRARY))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "accalloc_pluggable_malloc", "accalloc_pluggable_free")
    # The optional hooks, where this PyTorch exposes them.
    native = getattr(allocator, "_allocator", None)
    lib = ctypes.CDLL(path)
    for setter, symbol in (
        ("set_init_fn", "accalloc_pluggable_init"),
        ("set_reset_fn", "accalloc_pluggable_empty_cache"),
        ("set_memory_fraction_fn", "accalloc_pluggable_set_memory_fraction"),
        ("set_record_stream_fn", "accalloc_pluggable_record_stream"),
    ):
        if native is not None and hasattr(native, setter):
            getattr(native, setter)(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(allocator)
    library(path)
    return allocator


def _self_check():
    lib = library()
    print("accalloc on", lib.accalloc_device_type_name(lib.accalloc_current_accelerator()).decode())
    lib.accalloc_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p]
    lib.accalloc_free.argtypes = [ctypes.c_void_p]
    ptr = ctypes.c_void_p()
    _check(lib.accalloc_malloc(ctypes.byref(ptr), 1000, -1, None))
    stats = memory_stats()
    assert len(stats) == 122 and list(stats) == sorted(stats), "122 sorted keys"
    assert memory_allocated() == stats["allocated_bytes.all.current"] == 1024
    assert memory_reserved() == 2 << 20 and max_memory_reserved() == 2 << 20
    _check(lib.accalloc_free(ptr))
    assert memory_allocated() == 0 and max_memory_allocated() == 1024
    reset_peak_memory_stats()
    assert max_memory_allocated() == 0
    empty_cache()
    assert memory_reserved() == 0
    reset_accumulated_memory_stats()
    assert memory_stats()["num_device_free"] == 0
    free, total = get_memory_info()
    assert 0 < free <= total
    print(memory_summary(abbreviated=True))
    print("accalloc_torch self-check passed")


if __name__ == "__main__":
    _self_check()
    sys.exit(0)
