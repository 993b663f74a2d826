"""torch.nn.DataParallel over the host accelerator's two devices, as over two GPUs: the batch split
between them, the module copied to each, the outputs gathered on the first and the gradients summed
there; and torch.nn.parallel.comm's copies, which DataParallel is made of, each checked as CUDA's
behave (PyTorch's own are CUDA's C++ and refused the device: "Found no NVIDIA driver")."""
import copy

import pytest
import torch
from torch.nn.parallel import comm

from conftest import DEVICE


def net(batch_norm=False):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8)] + ([torch.nn.BatchNorm1d(8)] if batch_norm else []) + \
        [torch.nn.ReLU(), torch.nn.Linear(8, 3)]
    return torch.nn.Sequential(*layers)


def test_data_parallel_trains_as_one_device_on_the_whole_batch(fresh_device):
    reference = net()
    model = copy.deepcopy(reference).to(DEVICE)
    parallel = torch.nn.DataParallel(model, device_ids=[0, 1])
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    batches = [torch.randn(6, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for step, x in enumerate(batches):
        # A CPU batch and a batch already on the first device, as users hand them over.
        out = parallel(x if step % 2 else x.to(DEVICE))
        assert out.device == torch.device(DEVICE, 0) and out.shape == (6, 3)
        expected = reference(x)
        assert torch.allclose(out.cpu(), expected, atol=1e-6)
        for loss, optimizer in ((out.square().mean(), optimizers[0]), (expected.square().mean(), optimizers[1])):
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.device == torch.device(DEVICE, 0)
        assert torch.allclose(p.detach().cpu(), q.detach(), atol=1e-6)
    # The second half of each batch ran on the second device.
    assert torch.accelerator.memory_stats(1)["allocation.all.allocated"] > 0
    assert torch.accelerator.memory_allocated(1) == 0


def test_each_replica_normalizes_its_own_half_and_the_first_updates_the_running_statistics(fresh_device):
    reference = net(batch_norm=True)
    model = copy.deepcopy(reference).to(DEVICE)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    out = torch.nn.DataParallel(model, device_ids=[0, 1])(x)
    halves = [copy.deepcopy(reference)(half) for half in x.chunk(2)]
    assert torch.allclose(out.cpu(), torch.cat(halves), atol=1e-6)
    # CUDA's broadcast hands the first device its own buffers: replica 0 updates the module's.
    first = copy.deepcopy(reference)
    first(x[:4])
    assert torch.allclose(model[1].running_mean.cpu(), first[1].running_mean)
    assert model[1].num_batches_tracked.item() == 1


def test_broadcast_hands_the_source_device_its_tensor_and_copies_to_the_others(fresh_device):
    t = torch.arange(6.0, device=DEVICE)
    copies = comm.broadcast(t, [0, 1])
    assert copies[0] is t and copies[1].device == torch.device(DEVICE, 1) and torch.equal(copies[1].cpu(), t.cpu())
    from_cpu = comm.broadcast(torch.ones(2), [f"{DEVICE}:1", 0])
    assert [c.device.index for c in from_cpu] == [1, 0] and all(c.device.type == DEVICE for c in from_cpu)
    out = [torch.zeros(6, device=f"{DEVICE}:{i}") for i in (0, 1)]
    assert comm.broadcast(t, out=out) == tuple(out) and all(torch.equal(o.cpu(), t.cpu()) for o in out)
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        comm.broadcast(t)
    tensors = [t, torch.ones(2, 2, device=DEVICE)]
    coalesced = comm.broadcast_coalesced(tensors, [0, 1])
    assert coalesced[0][0] is t and coalesced[0][1] is tensors[1]
    assert [c.device.index for c in coalesced[1]] == [1, 1] and torch.equal(coalesced[1][1].cpu(), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match=r"all tensors must be on devices\[0\]: 1"):
        comm.broadcast_coalesced(tensors, [1, 0])
    # Complex tensors travel as their real views, as in PyTorch's comm.
    [[_], [moved]] = comm.broadcast_coalesced([torch.tensor([1 + 2j], device=DEVICE)], [0, 1])
    assert torch.equal(moved.cpu(), torch.tensor([[1.0, 2.0]]))


def test_scatter_and_gather_split_and_join_along_a_dimension(fresh_device):
    x = torch.arange(12.0).reshape(6, 2)
    on_device = x.to(DEVICE)
    parts = comm.scatter(on_device, [0, 1], chunk_sizes=[4, 2])
    assert [p.device.index for p in parts] == [0, 1] and [p.shape[0] for p in parts] == [4, 2]
    # A chunk already where it goes is the view it is (CUDA's does not copy it).
    assert parts[0].data_ptr() == on_device.data_ptr()
    assert torch.equal(parts[1].cpu(), x[4:])
    halves = comm.scatter(x, [0, 1], dim=1)
    assert [h.shape for h in halves] == [(6, 1), (6, 1)] and all(h.device.type == DEVICE for h in halves)
    with pytest.raises(RuntimeError, match="same length"):
        comm.scatter(on_device, [0, 1], chunk_sizes=[6])
    out = [torch.empty(3, 2, device=f"{DEVICE}:{i}") for i in (0, 1)]
    comm.scatter(on_device, out=out)
    assert torch.equal(out[1].cpu(), x[3:])

    assert torch.equal(comm.gather(parts).cpu(), x) and comm.gather(parts).device == torch.device(DEVICE, 0)
    assert comm.gather(halves, dim=1, destination=1).device == torch.device(DEVICE, 1)
    assert comm.gather(halves, dim=1, destination="cpu").device.type == "cpu"
    assert torch.equal(comm.gather(halves, dim=1, destination="cpu"), x)
    target = torch.empty(6, 2)
    assert comm.gather(parts, out=target) is target and torch.equal(target, x)
    summed = comm.reduce_add([torch.ones(3, device=f"{DEVICE}:{i}") for i in (0, 1)], destination=1)
    assert summed.device == torch.device(DEVICE, 1) and torch.equal(summed.cpu(), torch.full((3,), 2.0))

