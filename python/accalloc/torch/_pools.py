"""torch.cuda.MemPool's interface on the accalloc device: private pools over accalloc's C ABI.

    pool = accalloc.torch.MemPool()
    with accalloc.torch.use_mem_pool(pool):
        weights = torch.empty(1 << 20, device="accalloc")   # from the pool's own segments
    pool.use_count(), pool.snapshot()

The rules are PyTorch's (accalloc_core::caching::pools): the pool's blocks come from segments of its
own and return to it; a live pool keeps its free segments through empty_cache (pool.empty(live=True)
gives them back all the same, which PyTorch cannot); deleting the pool releases it, and its segments go
back once its tensors are gone. torch.accelerator's figures include pool memory.
"""
import contextlib
import ctypes
import json

import torch

import accalloc
from accalloc._library import ROUTE_THREAD, PoolId, check, library


def _device_type_and_index(device):
    """(accalloc device type, index) of `device` (None: the current one): a device of the accalloc
    accelerator, or a CUDA device once accalloc.torch.use_for_cuda() made accalloc CUDA's allocator
    (None means CUDA's current device when no accalloc accelerator is registered)."""
    from accalloc import torch as accalloc_torch

    name = accalloc_torch._host_name
    cuda = device is not None and not isinstance(device, int) and torch.device(device).type == "cuda"
    if cuda or (name is None and device is None and accalloc_torch._cuda_allocator is not None):
        if accalloc_torch._cuda_allocator is None:
            raise RuntimeError("a pool or region on a CUDA device needs accalloc.torch.use_for_cuda() first")
        index = accalloc_torch._device_index(device)
        return accalloc.DEVICE_CUDA, torch.cuda.current_device() if index < 0 else index
    if name is None:
        raise RuntimeError("register the accalloc device first (accalloc.torch.register_host_device()), or "
                           "make accalloc CUDA's allocator (accalloc.torch.use_for_cuda())")
    device_type = accalloc._DEVICE_TYPES[name]
    index = accalloc_torch._device_index(device)
    if index < 0:
        current = ctypes.c_int32()
        check(library().accalloc_current_device_on(device_type, ctypes.byref(current)))
        index = current.value
    return device_type, index


class PluggableAllocator:
    """Where a pool's memory comes from, as torch.cuda.memory.CUDAPluggableAllocator(path, alloc_fn_name,
    free_fn_name) names it: two functions of the shared library at `path`, `void *alloc(size_t size, int
    device, void *stream)` (NULL when it has no room) and `void free(void *ptr, size_t size, int device,
    void *stream)`. They run from whichever thread allocates, while accalloc holds the device: they must
    not call accalloc for it, and need no Python (no GIL)."""

    def __init__(self, path, alloc_fn_name, free_fn_name):
        self._library = ctypes.CDLL(str(path))  # kept loaded for as long as a pool may call it
        self.alloc = ctypes.cast(getattr(self._library, alloc_fn_name), ctypes.c_void_p).value
        self.free = ctypes.cast(getattr(self._library, free_fn_name), ctypes.c_void_p).value


class MemPool:
    """A private pool of the accalloc device (torch.cuda.MemPool's interface). `allocator`: a
    PluggableAllocator whose functions give the pool its segments (else the device does);
    `use_on_oom`: a request outside any pool that would fail may take one of this pool's free blocks;
    `no_split`: its blocks are never split."""

    def __init__(self, allocator=None, use_on_oom=False, no_split=False, device=None):
        if allocator is not None and not isinstance(allocator, PluggableAllocator):
            raise TypeError("MemPool(allocator=...) takes an accalloc.torch.PluggableAllocator(path, alloc_fn_name, "
                            f"free_fn_name) on the accalloc device, not {type(allocator).__name__}")
        self._type, self._device = _device_type_and_index(device)
        pool = PoolId()
        if allocator is None:
            check(library().accalloc_pool_create_on(self._type, self._device, int(bool(use_on_oom)),
                                                    int(bool(no_split)), ctypes.byref(pool)))
        else:
            check(library().accalloc_pool_create_with_functions_on(
                self._type, self._device, int(bool(use_on_oom)), int(bool(no_split)), allocator.alloc,
                allocator.free, ctypes.byref(pool)))
        self._allocator = allocator
        self._id = (pool.first, pool.second)
        self._released = False

    @property
    def id(self):
        """The pool's id, a pair as torch.cuda.MemPool's."""
        return self._id

    @property
    def device(self):
        return self._device

    def _pool(self):
        return PoolId(*self._id)

    def use_count(self):
        """Uses of the pool: its creation plus each use_mem_pool underway."""
        uses = ctypes.c_int64()
        check(library().accalloc_pool_info_on(self._type, self._device, self._pool(), ctypes.byref(uses), None))
        return max(uses.value, 0)

    def segment_count(self):
        """Segments the pool holds."""
        held = ctypes.c_int64()
        check(library().accalloc_pool_info_on(self._type, self._device, self._pool(), None, ctypes.byref(held)))
        return max(held.value, 0)

    def reserved_bytes(self):
        """The pool's share of memory_reserved (PyTorch's reserved_bytes_by_private_pools): for "all",
        "small_pool" and "large_pool", its "current", "peak", "allocated" and "freed" bytes."""
        from accalloc._library import Stat

        slots = [Stat(), Stat(), Stat()]
        check(library().accalloc_pool_reserved_bytes_on(self._type, self._device, self._pool(),
                                                         *(ctypes.byref(s) for s in slots)))
        fields = ("current", "peak", "allocated", "freed")
        return {name: {f: getattr(slot, f) for f in fields}
                for name, slot in zip(("all", "small_pool", "large_pool"), slots)}

    def snapshot(self, include_traces=True):
        """The pool's segments, as torch.cuda.MemPool.snapshot() gives them (the snapshot's segments
        whose segment_pool_id is this pool's)."""
        lib = library()
        needed = ctypes.c_size_t()
        check(lib.accalloc_memory_snapshot_json_on(self._type, None, 0, ctypes.byref(needed)))
        buffer = ctypes.create_string_buffer(needed.value)
        check(lib.accalloc_memory_snapshot_json_on(self._type, buffer, needed.value, ctypes.byref(needed)))
        snapshot = json.loads(buffer.value.decode())
        pool_id = list(self._id)
        return [s for s in snapshot["segments"]
                if s["segment_pool_id"] == pool_id and s["device"] == self._device]

    def empty(self, live=True):
        """Give back the pool's free whole segments. accalloc's own: PyTorch keeps a live pool's
        (live=False does what torch.cuda.empty_cache does for a pool: nothing while it lives)."""
        check(library().accalloc_pool_empty_cache_on(self._type, self._device, self._pool(), int(bool(live))))

    def __del__(self):
        # ~MemPool: the creation's use released, the pool's cache emptied; its tensors still alive
        # keep their blocks, which return to the pool and go back with the next empty_cache.
        if getattr(self, "_released", True):
            return
        self._released = True
        try:
            lib = library()
            lib.accalloc_pool_release_on(self._type, self._device, self._pool())
            lib.accalloc_pool_empty_cache_on(self._type, self._device, self._pool(), 0)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing to report to
            pass


@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    """Route this thread's allocations on the accalloc device to `pool` (other threads' are not), as
    torch.cuda.use_mem_pool does; nests."""
    device_type, index = (pool._type, pool._device) if device is None else _device_type_and_index(device)
    lib = library()
    check(lib.accalloc_pool_begin_on(device_type, index, pool._pool(), ROUTE_THREAD, None))
    try:
        yield
    finally:
        check(lib.accalloc_pool_end_on(device_type, index, pool._pool()))
        check(lib.accalloc_pool_release_on(device_type, index, pool._pool()))
