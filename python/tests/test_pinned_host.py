"""Pinned host memory on the accalloc device: pin_memory=True, tensor.pin_memory(), non-blocking copies,
torch.accelerator.empty_host_cache() and accalloc.torch.host_memory_stats(), with PyTorch's figures
worked out by hand (its own test: torch.ones(10 * 1024, pin_memory=True) is 40,960 bytes, rounded to
65,536)."""
import gc
import threading

import pytest
import torch

import accalloc
import accalloc.torch
from conftest import run_python

KEYS = {f"{family}.{field}" for family in ("allocations", "allocated_bytes", "active_requests", "active_bytes")
        for field in ("current", "peak", "allocated", "freed")}
KEYS |= {f"{family}.{field}" for family in ("host_alloc_time", "host_free_time")
         for field in ("total", "max", "min", "count", "avg")}
KEYS |= {"num_host_alloc", "num_host_free", "page_locked_bytes"}


@pytest.fixture
def fresh_host_cache():
    """Nothing pinned is live or cached, and every pinned statistic starts again."""
    gc.collect()
    torch.accelerator.empty_host_cache()
    assert accalloc.torch.host_memory_stats()["allocations.current"] == 0, "a test before this one kept pinned memory"
    accalloc.torch.reset_accumulated_host_memory_stats()
    accalloc.torch.reset_peak_host_memory_stats()
    yield
    gc.collect()


def stats():
    return accalloc.torch.host_memory_stats()


def test_pytorchs_own_example(fresh_host_cache):
    t = torch.ones(10 * 1024, pin_memory=True)
    assert t.is_pinned() and t.sum().item() == 10240
    s = stats()
    assert set(s) == KEYS
    assert (s["allocations.current"], s["allocated_bytes.current"]) == (1, 65536)
    assert (s["active_requests.current"], s["active_bytes.current"]) == (1, 65536)
    assert (s["num_host_alloc"], s["num_host_free"]) == (1, 0)
    assert s["host_alloc_time.count"] == 1
    # empty_host_cache while the tensor lives changes nothing.
    torch.accelerator.empty_host_cache()
    assert stats() == s
    del t
    s = stats()
    assert (s["active_requests.current"], s["allocations.current"]) == (0, 1), "cached, not given back"
    torch.accelerator.empty_host_cache()
    s = stats()
    assert (s["allocations.current"], s["allocated_bytes.freed"], s["num_host_free"]) == (0, 65536, 1)
    # torch.<device> has torch.cuda's names too.
    assert torch.accalloc.host_memory_stats() == s


def test_a_freed_block_is_reused_by_a_request_of_its_power_of_two(fresh_host_cache):
    a = torch.empty(40960, dtype=torch.uint8, pin_memory=True)
    address = a.data_ptr()
    del a
    b = torch.empty(50000, dtype=torch.uint8, pin_memory=True)  # 65,536 too
    assert b.data_ptr() == address
    c = torch.empty(70000, dtype=torch.uint8, pin_memory=True)  # 131,072: a new block
    s = stats()
    assert s["num_host_alloc"] == 2
    assert s["allocated_bytes.current"] == 65536 + 131072
    assert (s["active_requests.allocated"], s["active_requests.freed"]) == (3, 1)
    del b, c


def test_pin_memory_and_non_blocking_copies_give_the_cpus_results(fresh_host_cache):
    x = torch.randn(64, 33)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned() and torch.equal(pinned, x)
    assert pinned[5:].is_pinned(), "a view into pinned memory is pinned"
    on_device = pinned.to("accalloc", non_blocking=True)
    torch.accelerator.synchronize()
    assert torch.equal(on_device.cpu(), x)
    back = (on_device * 2).to("cpu", non_blocking=True)
    torch.accelerator.synchronize()
    assert back.is_pinned(), "a non-blocking copy to the CPU lands in pinned memory"
    assert torch.equal(back, x * 2)
    s = stats()
    assert s["active_requests.current"] == 2 and s["num_host_alloc"] == 2


def test_a_block_a_copy_used_waits_for_the_copys_stream(fresh_host_cache):
    used = torch.randn(1000).pin_memory()
    unused = torch.randn(1000).pin_memory()
    used.to("accalloc", non_blocking=True)
    del used, unused
    # The block the copy used waits for the event recorded on the device's stream at its free; the
    # other is reusable at once. The next allocation (or empty_host_cache) processes the event.
    assert stats()["active_requests.current"] == 1
    torch.accelerator.empty_host_cache()
    s = stats()
    assert (s["active_requests.current"], s["allocations.current"]) == (0, 0)


def test_resets(fresh_host_cache):
    a = torch.empty(1000, pin_memory=True)  # 4,000 bytes: 4,096
    del a
    b = torch.empty(3000, pin_memory=True)  # 12,000 bytes: 16,384
    s = stats()
    # Peaks are summed per power of two, as PyTorch's are: 1 + 1 where one was ever active at once.
    assert (s["active_requests.peak"], s["active_bytes.peak"]) == (2, 4096 + 16384)
    accalloc.torch.reset_peak_host_memory_stats()
    s = stats()
    assert (s["active_requests.peak"], s["allocations.peak"]) == (1, 2)
    assert (s["host_alloc_time.max"], s["host_alloc_time.min"]) == (0, 0)
    accalloc.torch.reset_accumulated_host_memory_stats()
    s = stats()
    assert (s["num_host_alloc"], s["allocations.allocated"], s["host_alloc_time.count"]) == (0, 0, 0)
    assert s["allocations.current"] == 2
    del b


def test_threads_pinning_at_once_keep_the_books(fresh_host_cache):
    errors = []

    def work(seed):
        try:
            for i in range(200):
                t = torch.full((256 + (seed * 7 + i) % 512,), float(i), pin_memory=True)
                assert t.is_pinned() and t[0].item() == float(i)
                del t
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    s = stats()
    assert s["active_requests.current"] == 0
    assert s["active_requests.allocated"] == 800
    assert s["allocations.current"] == s["num_host_alloc"] <= 4 * 2, "blocks were reused"


def test_a_data_loader_pins_its_batches(fresh_host_cache):
    data = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True)
    batches = list(loader)
    assert all(batch[0].is_pinned() for batch in batches)
    assert torch.equal(torch.cat([b[0] for b in batches]), data.tensors[0])
    assert stats()["active_requests.current"] == 4


def test_pinned_memory_that_cannot_be_had_is_an_out_of_memory_error():
    code, out = run_python("""
        import torch, accalloc, accalloc.torch
        accalloc.torch.register_host_device()
        a = torch.empty(1000, pin_memory=True)          # the first allocation succeeds
        try:
            torch.empty(100000, pin_memory=True)       # the backend refuses every later one
        except torch.OutOfMemoryError as e:
            print("refused:", str(e).splitlines()[0])
        s = accalloc.torch.host_memory_stats()
        print(s["num_host_alloc"], s["allocations.current"], s["active_requests.current"])
        address = a.data_ptr()
        del a
        again = torch.empty(900, pin_memory=True)       # the cached block: no backend call
        print(again.data_ptr() == address, accalloc.torch.host_memory_stats()["num_host_alloc"])
        """, ACCALLOC_HOST_FAIL="alloc:after=1")
    assert code == 0, out
    assert "refused: pinned host memory: tried to allocate 390.62 KiB on the host backend" in out, out
    assert "1 1 1\n" in out, out
    assert "True 1\n" in out, out


def test_the_package_api_without_pytorch():
    code, out = run_python("""
        import os, resource
        import accalloc
        p = accalloc.host_malloc(40960)
        print(accalloc.is_pinned(p + 65535), accalloc.is_pinned(p + 65536))
        s = accalloc.host_memory_stats("host")
        # mlock succeeds where the locked-memory limit allows 64 KiB more (root: no limit at all).
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        may_lock = os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 65536
        print(s["allocated_bytes.current"], s["page_locked_bytes"] == (65536 if may_lock else 0))
        accalloc.host_free(p)
        accalloc.empty_host_cache()
        print(accalloc.host_memory_stats()["num_host_free"], accalloc.host_malloc(0))
        try:
            accalloc.host_free(p)
        except accalloc.AccallocError as e:
            print("refused:", e)
        """)
    assert code == 0, out
    assert out.startswith("True False\n65536 True\n1 0\nrefused:"), out
    assert "is not pinned host memory from accalloc" in out, out
