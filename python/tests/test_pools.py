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
    with pytest.raises(NotImplementedError):
        accalloc.torch.MemPool(allocator=object())
    del a, b, c, outer, inner
