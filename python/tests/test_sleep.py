"""Sleep and wake on the accalloc device (accalloc.torch.region, pause, resume), as torch_memory_saver's
users drive it: the device gets the memory back while tensors keep their addresses, a backup brings
the contents back, the books stay as they were. Figures worked out from the rules (20 MiB pages for
large requests, 2 MiB for small ones)."""
import pytest
import torch

import accalloc
import accalloc.torch
from conftest import MiB


@pytest.fixture
def tags(fresh_device):
    yield
    accalloc.torch.forget()
    torch.accelerator.empty_cache()


def free_bytes():
    return torch.accelerator.get_memory_info(0)[0]


def test_a_paused_tag_gives_its_memory_back_and_resumes_with_its_contents(tags):
    with accalloc.torch.region("weights", enable_cpu_backup=True):
        weights = torch.arange(5 * MiB // 4, dtype=torch.int32, device="accalloc")
    address = weights.data_ptr()
    allocated = torch.accelerator.memory_allocated()
    running = free_bytes()
    accalloc.torch.pause("weights")
    assert free_bytes() - running == 20 * MiB, "one 20 MiB page went back to the device"
    assert accalloc.torch.paused_bytes("weights") == 20 * MiB
    assert torch.accelerator.memory_allocated() == allocated, "the books describe the blocks"
    with pytest.raises(RuntimeError, match="paused"):
        with accalloc.torch.region("weights", enable_cpu_backup=True):
            torch.empty(10, device="accalloc")
    accalloc.torch.pause("weights")  # paused already: nothing to do
    accalloc.torch.resume("weights")
    assert free_bytes() == running
    assert weights.data_ptr() == address
    assert torch.equal(weights.cpu(), torch.arange(5 * MiB // 4, dtype=torch.int32))
    del weights


def test_pause_and_resume_every_tag_and_allocate_again(tags):
    with accalloc.torch.region("weights", enable_cpu_backup=True):
        weights = torch.full((1000,), 7.0, device="accalloc")
    with accalloc.torch.region("kv_cache"):
        cache = torch.zeros(3 * MiB // 4, device="accalloc")
    accalloc.torch.pause()
    assert accalloc.torch.paused_bytes() == 2 * MiB + 20 * MiB
    accalloc.torch.resume()
    assert accalloc.torch.paused_bytes() == 0
    assert float(weights.sum()) == 7000.0
    cache.fill_(1.0)  # no backup: undefined contents, but the memory is there again
    assert float(cache.sum()) == 3 * MiB // 4
    with accalloc.torch.region("kv_cache"):
        more = torch.empty(1000, device="accalloc")
    assert more.data_ptr() != 0
    with pytest.raises(ValueError, match="keeps its setting"):
        with accalloc.torch.region("kv_cache", enable_cpu_backup=True):
            pass
    with pytest.raises(ValueError, match="no region"):
        accalloc.torch.pause("never used")
    del weights, cache, more


def test_an_operator_given_a_paused_tensor_raises_naming_its_tag(tags):
    # Its memory went back to the device: a kernel reading it would crash the process (the host's
    # pages are inaccessible while paused). What a user tries first: print it, add to it, copy it.
    with accalloc.torch.region("kv_cache"):
        cache = torch.ones(1000, device="accalloc")
    other = torch.ones(1000, device="accalloc")
    view = cache[10:20]
    accalloc.torch.pause("kv_cache")
    attempts = (lambda c, o, v: c + o, lambda c, o, v: o.add_(v), lambda c, o, v: c.cpu(),
                lambda c, o, v: float(v.sum()), lambda c, o, v: print(c), lambda c, o, v: c.fill_(2.0))
    for attempt in attempts:
        with pytest.raises(RuntimeError, match="paused tag 'kv_cache'"):
            attempt(cache, other, view)
    assert float(other.sum()) == 1000.0, "tensors outside the tag work on"
    accalloc.torch.resume("kv_cache")
    cache.fill_(2.0)
    assert float((cache + other).sum()) == 3000.0
    del cache, other, view


def test_a_region_on_cuda_needs_accalloc_as_cudas_allocator(tags):
    with pytest.raises(RuntimeError, match="use_for_cuda"):
        with accalloc.torch.region("weights", device="cuda"):
            pass
