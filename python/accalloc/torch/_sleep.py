"""Sleep and wake on the accalloc device, as torch_memory_saver's users know it:

    with accalloc.torch.region("weights", enable_cpu_backup=True):
        model = build_model().to("accalloc")
    with accalloc.torch.region("kv_cache"):
        cache = make_kv_cache()
    accalloc.torch.pause()            # every tag: the device gets the memory back
    accalloc.torch.resume("weights")  # the same addresses, the weights' contents back

A tag is a sleepable private pool of its own (accalloc_pool_set_sleepable): allocations in its region
(this thread's) live in its segments, cached and reused within it. pause(tag) gives the memory behind
its pages back and keeps the addresses, with a copy of the contents in host memory when the tag asked
for a backup; resume(tag) maps new memory at the same addresses and copies the backup back (without
one, the contents are undefined, as a KV cache allows). Tensors keep their addresses throughout;
between pause and resume an operator given one of them raises RuntimeError naming the tag (their
memory is back with the device), and so does allocating in a paused tag.
"""
import contextlib
import ctypes
import threading

from accalloc._library import DEVICE_CUDA, check, library
from accalloc.torch._pools import MemPool, _device_type_and_index, use_mem_pool

_lock = threading.Lock()
# (device type, device, tag) -> (its pool, whether its pauses keep a backup)
_tags = {}


def _tag(tag, enable_cpu_backup, device):
    device_type, index = _device_type_and_index(device)
    key = (device_type, index, tag)
    with _lock:
        entry = _tags.get(key)
        if entry is None:
            # The device as resolved, its type kept: a bare index means the accalloc device's.
            pool = MemPool(device=f"cuda:{index}" if device_type == DEVICE_CUDA else index)
            check(library().accalloc_pool_set_sleepable_on(device_type, index, pool._pool()))
            if device_type != DEVICE_CUDA:  # a GPU's kernels check nothing: the host's do
                _name(pool._pool(), tag)
            entry = _tags[key] = (pool, bool(enable_cpu_backup))
        elif entry[1] != bool(enable_cpu_backup):
            raise ValueError(f"tag {tag!r} was made with enable_cpu_backup={entry[1]}: a tag keeps its setting")
    return entry


def _name(pool_id, tag):
    """Tell the device's kernels the tag's name: an operator given one of its tensors while it is
    paused raises RuntimeError naming it."""
    from accalloc import torch as accalloc_torch

    extension = accalloc_torch._extension("_torch_host")
    extension.accalloc_torch_name_tag.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p]
    extension.accalloc_torch_name_tag.restype = None
    extension.accalloc_torch_name_tag(pool_id.first, pool_id.second, str(tag).encode())


@contextlib.contextmanager
def region(tag="default", enable_cpu_backup=False, device=None):
    """This thread's allocations on the accalloc device (or, after accalloc.torch.use_for_cuda(), on
    CUDA: device="cuda", or None where no accalloc device is registered) go to `tag`'s memory (made
    on first use), which pause(tag) gives back to the device and resume(tag) brings back at the same
    addresses; `enable_cpu_backup`: its contents survive the pause (kept in host memory meanwhile)."""
    pool, _ = _tag(tag, enable_cpu_backup, device)
    with use_mem_pool(pool):
        yield


def _selected(tag):
    with _lock:
        chosen = [(key, entry) for key, entry in _tags.items() if tag is None or key[2] == tag]
    if tag is not None and not chosen:
        raise ValueError(f"no region has used tag {tag!r}")
    return chosen


def pause(tag=None):
    """Give the memory of `tag` (None: every tag) back to the device, keeping its addresses (and its
    contents in host memory, where the tag asked for a backup). Pausing a paused tag does nothing."""
    for (device_type, index, _), (pool, backup) in _selected(tag):
        check(library().accalloc_pool_pause_on(device_type, index, pool._pool(), int(backup)))


def resume(tag=None):
    """Bring the memory of `tag` (None: every tag) back at the same addresses, its backup copied
    back. Resuming a running tag does nothing."""
    for (device_type, index, _), (pool, _backup) in _selected(tag):
        check(library().accalloc_pool_resume_on(device_type, index, pool._pool()))


def paused_bytes(tag=None):
    """Bytes of `tag` (None: every tag) paused now."""
    total = 0
    for (device_type, index, _), (pool, _backup) in _selected(tag):
        value = ctypes.c_int64()
        check(library().accalloc_pool_paused_bytes_on(device_type, index, pool._pool(), ctypes.byref(value)))
        total += max(value.value, 0)
    return total


def forget(tag=None):
    """Let go of `tag` (None: every tag): resumed first if paused, its pool released, so that its
    memory goes back to the device once its tensors are gone. A later region(tag) makes it anew."""
    resume(tag)
    with _lock:
        for key in [key for key in _tags if tag is None or key[2] == tag]:
            del _tags[key]  # the MemPool goes: released, and its cache emptied
