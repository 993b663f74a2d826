"""Private pools on the accalloc device, with torch.cuda.MemPool's interface: accalloc.torch.MemPool and
use_mem_pool, by PyTorch's rules (a pool's tensors come from segments of its own; a live pool keeps its
free segments through empty_cache; deleting it lets them go), figures worked out by hand."""
import threading

import pytest
import torch

import accalloc
import accalloc.torch
from conftest import MiB


def stats():
    return accalloc.memory_stats("accalloc:0")


def test_a_pools_tensors_come_from_its_own_segments(fresh_device):
    pool = accalloc.torch.MemPool()
    assert pool.id[0] == 0 and pool.id[1] >= 1
    assert pool.use_count() == 1
    with accalloc.torch.use_mem_pool(pool):
        assert pool.use_count() == 2
        inside = torch.empty(1000, dtype=torch.uint8, device="accalloc")
    assert pool.use_count() == 1
    outside = torch.empty(1000, dtype=torch.uint8, device="accalloc")
    # Two small segments: the pool's free remainder is not the default pools'.
    assert stats()["segment.small_pool.current"] == 2
    assert torch.accelerator.memory_allocated() == 2048, "pool memory counts device-wide"
    [segment] = pool.snapshot()
    assert segment["segment_pool_id"] == list(pool.id)
    assert segment["total_size"] == 2 * MiB and segment["allocated_size"] == 1024
    # Its share of memory_reserved: its own small segment only.
    reserved = pool.reserved_bytes()
    assert reserved["all"] == {"current": 2 * MiB, "peak": 2 * MiB, "allocated": 2 * MiB, "freed": 0}
    assert reserved["large_pool"]["current"] == 0
    del inside, outside
    torch.accelerator.empty_cache()
    # The pool lives: its segment stays reserved; the default one went.
    assert torch.accelerator.memory_reserved() == 2 * MiB
    assert pool.segment_count() == 1
    del pool
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == 0


def test_other_threads_allocate_outside_the_pool(fresh_device):
    pool = accalloc.torch.MemPool()
    theirs = []
    with accalloc.torch.use_mem_pool(pool):
        mine = torch.empty(4096, dtype=torch.uint8, device="accalloc")
        worker = threading.Thread(target=lambda: theirs.append(torch.empty(4096, dtype=torch.uint8,
                                                                           device="accalloc")))
        worker.start()
        worker.join()
    assert pool.segment_count() == 1
    assert stats()["segment.all.current"] == 2
    assert [s["address"] for s in pool.snapshot()] != [], "the pool's segment"
    theirs.clear()
    del mine
    del pool


def test_a_tensor_outliving_its_pool_returns_to_it_and_then_goes_back(fresh_device):
    pool = accalloc.torch.MemPool()
    with accalloc.torch.use_mem_pool(pool):
        kept = torch.ones(10, device="accalloc")
    del pool
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == 2 * MiB, "its tensor still lives"
    assert kept.sum().item() == 10.0
    del kept
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == 0


def test_emptying_a_live_pool_gives_back_its_free_segments(fresh_device):
    pool = accalloc.torch.MemPool()
    with accalloc.torch.use_mem_pool(pool):
        big = torch.empty(3 * MiB, dtype=torch.uint8, device="accalloc")  # a 20 MiB segment
        small = torch.empty(10, device="accalloc")
    del big
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == 22 * MiB, "PyTorch's rule: a live pool keeps them"
    pool.empty(live=False)
    assert torch.accelerator.memory_reserved() == 22 * MiB
    pool.empty()  # accalloc's own
    assert torch.accelerator.memory_reserved() == 2 * MiB
    del small, pool


def test_no_split_hands_out_whole_segments(fresh_device):
    pool = accalloc.torch.MemPool(no_split=True)
    with accalloc.torch.use_mem_pool(pool):
        t = torch.empty(1000, dtype=torch.uint8, device="accalloc")
    s = stats()
    assert s["allocated_bytes.small_pool.current"] == 2 * MiB
    assert s["requested_bytes.small_pool.current"] == 1000
    assert s["inactive_split.small_pool.current"] == 0
    del t, pool


def test_pools_nest_and_misuse_is_refused(fresh_device):
    outer, inner = accalloc.torch.MemPool(), accalloc.torch.MemPool()
    with accalloc.torch.use_mem_pool(outer):
        a = torch.empty(100, device="accalloc")
        with accalloc.torch.use_mem_pool(inner):
            b = torch.empty(100, device="accalloc")
            with pytest.raises(accalloc.AccallocError, match="already go to pool"):
                with accalloc.torch.use_mem_pool(inner):
                    pass
        c = torch.empty(100, device="accalloc")
    assert (outer.segment_count(), inner.segment_count()) == (1, 1)
    assert inner.use_count() == 1 and outer.use_count() == 1
    del a, b, c, outer, inner


ALLOCATOR_SOURCE = r"""
#include <stdlib.h>
static long long live;
void *pool_alloc(size_t size, int device, void *stream) {
    void *p = NULL;
    (void)device, (void)stream;
    if (posix_memalign(&p, 512, size) != 0) return NULL;
    live += (long long)size;
    return p;
}
void pool_free(void *ptr, size_t size, int device, void *stream) {
    (void)device, (void)stream;
    free(ptr);
    live -= (long long)size;
}
long long pool_live_bytes(void) { return live; }
"""


def test_a_pool_with_an_allocator_of_its_own_takes_its_segments_from_it(fresh_device, tmp_path):
    import ctypes
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the pool's allocator")
    source, library_path = tmp_path / "pool_allocator.c", tmp_path / "libpool_allocator.so"
    source.write_text(ALLOCATOR_SOURCE)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", str(source), "-o", str(library_path)], check=True)
    live_bytes = ctypes.CDLL(str(library_path)).pool_live_bytes
    live_bytes.restype = ctypes.c_longlong

    allocator = accalloc.torch.PluggableAllocator(library_path, "pool_alloc", "pool_free")
    pool = accalloc.torch.MemPool(allocator=allocator)
    with accalloc.torch.use_mem_pool(pool):
        weights = torch.ones(1000, dtype=torch.uint8, device="accalloc")
    outside = torch.empty(1000, dtype=torch.uint8, device="accalloc")
    # The pool's 2 MiB segment is the library's; the default pools' is the device's.
    assert live_bytes() == 2 * MiB
    assert torch.accelerator.memory_reserved() == 4 * MiB
    assert int(weights.sum()) == 1000
    del weights, outside, pool
    torch.accelerator.empty_cache()
    assert live_bytes() == 0
    assert torch.accelerator.memory_reserved() == 0
    with pytest.raises(TypeError, match="PluggableAllocator"):
        accalloc.torch.MemPool(allocator=object())
