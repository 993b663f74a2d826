"""The host accelerator's fallback (host_cpu_call.cpp) where it is easiest to get wrong: out= arguments
that the CPU's kernel resizes (views with offsets, storage that must grow), overlap that the CPU refuses,
results over an argument's memory, where a kernel's allocations are counted, sparse results, and two
threads on two devices at once. Every case is checked against the same calls on the CPU.
"""
import gc
import threading

import pytest
import torch

from conftest import DEVICE


def both(make):
    """make(device) on the CPU and on the device: (cpu result, device result)."""
    return make("cpu"), make(DEVICE)


def test_an_out_argument_is_resized_as_on_the_cpu(fresh_device):
    a = torch.randn(5)

    def run(device):
        out = torch.empty(0, device=device)
        returned = torch.add(a.to(device), a.to(device), out=out)
        assert returned is out
        return out

    cpu, dev = both(run)
    assert dev.shape == (5,) and torch.equal(dev.cpu(), cpu)
    # The grown storage is accalloc's block: five floats rounded to 512 bytes.
    assert torch.accelerator.memory_allocated(0) == 512
    del dev


@pytest.mark.parametrize("start", [2, 8])
def test_an_out_view_resized_past_its_base_grows_the_shared_storage(fresh_device, start):
    # From 2 the storage of 10 holds the 5 results; from 8 it must grow to 13, and the base sees it.
    a = torch.arange(5.0)

    def run(device):
        base = torch.zeros(10, device=device)
        out = base[start:start + 2]
        with pytest.warns(UserWarning, match="resized"):
            torch.mul(a.to(device), 3, out=out)
        return base, out

    (cpu_base, cpu_out), (dev_base, dev_out) = both(run)
    assert dev_out.storage_offset() == cpu_out.storage_offset() == start
    assert dev_base.untyped_storage().nbytes() == cpu_base.untyped_storage().nbytes()
    assert torch.equal(dev_out.cpu(), cpu_out)
    assert torch.equal(dev_base.cpu(), cpu_base)
    assert dev_base.untyped_storage().data_ptr() == dev_out.untyped_storage().data_ptr()
    del dev_base, dev_out


def test_overlap_the_cpu_refuses_is_refused_on_the_device(fresh_device):
    def run(device):
        x = torch.arange(6.0, device=device)
        with pytest.raises(RuntimeError, match="single memory location"):
            torch.add(x[:4], 1, out=x[2:])
        return x

    cpu, dev = both(run)
    assert torch.equal(dev.cpu(), cpu)
    del dev


def test_in_place_on_an_expanded_tensor_is_refused_as_on_the_cpu(fresh_device):
    for device in ("cpu", DEVICE):
        x = torch.zeros(1, device=device).expand(4)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            x.add_(1)


# An operator with a CPU kernel only, whose result is a view of its argument (as a vendor's or a
# library's own operators may be): on the device it runs through the fallback.
torch.library.define("accalloc_test::first_half", "(Tensor(a) x) -> Tensor(a)")
torch.library.impl("accalloc_test::first_half", "CPU")(lambda x: x[: x.shape[0] // 2])


def test_a_result_over_an_arguments_memory_is_a_view_of_it(fresh_device):
    x = torch.zeros(6, device=DEVICE)
    half = torch.ops.accalloc_test.first_half(x)
    assert half.device == x.device and half.shape == (3,)
    assert half.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    half.fill_(7)
    assert x.cpu().tolist() == [7, 7, 7, 0, 0, 0]
    assert torch.accelerator.memory_allocated(0) == 512  # x's block only: the view took none
    del x, half


def test_a_kernels_scratch_is_freed_and_its_result_counted_on_its_device(fresh_device):
    x = torch.randn(256, 256, device=DEVICE)
    before = torch.accelerator.memory_allocated(0)
    torch.accelerator.reset_peak_memory_stats(0)
    values, indices = torch.sort(x, dim=1)  # the CPU's sort allocates scratch of its own
    results = values.numel() * 4 + indices.numel() * 8
    assert torch.accelerator.memory_allocated(0) == before + results
    assert torch.accelerator.max_memory_allocated(0) >= before + results
    assert torch.accelerator.memory_allocated(1) == 0
    del values, indices, x
    gc.collect()
    assert torch.accelerator.memory_allocated(0) == 0


def test_a_result_lands_on_its_arguments_device_whatever_the_current_one(fresh_device):
    x = torch.randn(64, device=f"{DEVICE}:1")
    torch.accelerator.set_device_index(0)
    y = x * 2
    assert y.device == torch.device(f"{DEVICE}:1")
    assert torch.accelerator.memory_allocated(1) == 2 * 512 and torch.accelerator.memory_allocated(0) == 0
    assert torch.accelerator.current_device_index() == 0
    del x, y


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_a_sparse_coo_result_is_the_devices_and_another_layout_a_clear_error(fresh_device):
    # A sparse COO tensor is its indices and values, made in the device's memory; a compressed layout
    # (CSR and the like) is refused with an error naming the device.
    x = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]], device=DEVICE)
    sparse = x.to_sparse()
    assert sparse.layout == torch.sparse_coo and sparse.device == torch.device(f"{DEVICE}:0")
    assert sparse._values().device == sparse._indices().device == sparse.device
    assert torch.accelerator.memory_allocated(0) == 512 + 512 + 512  # x, the indices, the values
    assert torch.equal(sparse.cpu().to_dense(), x.cpu())
    with pytest.raises(NotImplementedError, match="accalloc device .* holds strided and sparse COO tensors only"):
        x.to_sparse_csr()
    del x, sparse
    gc.collect()
    assert torch.accelerator.memory_allocated(0) == 0


def test_two_threads_on_two_devices_compute_and_count_apart(fresh_device):
    inputs = [torch.randn(64, 64) for _ in range(2)]
    expected = [(x @ x + 1).sum(dim=0) for x in inputs]
    errors = []
    peaks = [0, 0]

    def work(index):
        try:
            torch.accelerator.set_device_index(index)
            x = inputs[index].to(f"{DEVICE}:{index}")
            for _ in range(200):
                out = torch.empty(0, device=f"{DEVICE}:{index}")
                torch.sum(x @ x + 1, dim=0, out=out)
                assert out.device.index == index
                assert torch.equal(out.cpu(), expected[index])
                peaks[index] = max(peaks[index], torch.accelerator.memory_allocated(index))
        except Exception as e:  # noqa: BLE001 (reported below, with its thread)
            errors.append((index, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Each device held its own tensors only: x, a product, a sum, the out tensor (16 KiB, 16 KiB,
    # 16 KiB, 512 B), never the other thread's.
    assert all(0 < peak <= 3 * 16384 + 512 for peak in peaks), peaks
    gc.collect()
    assert torch.accelerator.memory_allocated(0) == torch.accelerator.memory_allocated(1) == 0
