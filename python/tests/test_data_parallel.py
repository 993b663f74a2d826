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
    # Each replica's first layer records where its half of the batch ran.
    ran = []
    model[0].register_forward_hook(lambda module, args, out: ran.append((args[0].device.index, len(args[0]))))
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
    # Each half of each batch ran on its own device.
    assert sorted(ran) == [(0, 3)] * 3 + [(1, 3)] * 3
    assert torch.accelerator.memory_allocated(1) == 0


def test_data_parallel_under_autocast_gathers_the_replicas_outputs(fresh_device):
    """The replicas run on PyTorch's threads, whose autocast dtype for the device is PyTorch's
    per-thread default; the gathered output keeps theirs (a cat under the caller's autocast refused
    half-precision outputs: "Unexpected floating ScalarType")."""
    reference = net()
    model = copy.deepcopy(reference).to(DEVICE)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(5))
    for dtype in (None, torch.bfloat16, torch.float16):
        with torch.autocast(DEVICE, **({} if dtype is None else {"dtype": dtype})):
            out = torch.nn.DataParallel(model, device_ids=[0, 1])(x)
        assert out.device == torch.device(DEVICE, 0) and out.shape == (6, 3)
        assert torch.allclose(out.float().cpu(), reference(x), atol=0.05)


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
    from_cpu = comm.broadcast(torch.ones(2), (d for d in [f"{DEVICE}:1", 0]))  # a generator, read once
    assert [c.device.index for c in from_cpu] == [1, 0] and all(c.device.type == DEVICE for c in from_cpu)
    assert all(torch.equal(c.cpu(), torch.ones(2)) for c in from_cpu)
    # The copies are the device's own, contiguous, with no autograd history, as CUDA's.
    weight = torch.randn(3, 2, device=DEVICE, requires_grad=True)
    [same], [moved] = comm.broadcast_coalesced([weight.t()], [0, 1])
    assert same.requires_grad and not moved.requires_grad and moved.grad_fn is None
    assert moved.is_contiguous() and torch.equal(moved.cpu(), weight.detach().t().cpu())
    out = [torch.zeros(6, device=f"{DEVICE}:{i}") for i in (0, 1)]
    assert comm.broadcast(t, out=out) == tuple(out) and all(torch.equal(o.cpu(), t.cpu()) for o in out)
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        comm.broadcast(t)
    with pytest.raises(RuntimeError, match=r"output tensor of shape \(2, 6\) does not match"):
        comm.broadcast(t, out=[torch.zeros(2, 6, device=DEVICE)])
    tensors = [t, torch.ones(2, 2, device=DEVICE)]
    coalesced = comm.broadcast_coalesced(tensors, [0, 1])
    assert coalesced[0][0] is t and coalesced[0][1] is tensors[1]
    assert [c.device.index for c in coalesced[1]] == [1, 1] and torch.equal(coalesced[1][1].cpu(), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match=r"All tensors must be on devices\[0\]: 1"):
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
    assert comm.scatter(on_device, out=out) == tuple(out)
    assert torch.equal(out[0].cpu(), x[:3]) and torch.equal(out[1].cpu(), x[3:])
    with pytest.raises(RuntimeError, match="do not add up"):
        comm.scatter(on_device, out=[torch.empty(3, 2, device=DEVICE)])
    with pytest.raises(RuntimeError, match="does not match the expected shape"):
        comm.scatter(on_device, out=[torch.empty(3, 5, device=DEVICE), torch.empty(3, 5, device=DEVICE)])

    assert torch.equal(comm.gather(parts).cpu(), x) and comm.gather(parts).device == torch.device(DEVICE, 0)
    assert comm.gather(halves, dim=1, destination=1).device == torch.device(DEVICE, 1)
    assert comm.gather(halves, dim=1, destination="cpu").device.type == "cpu"
    assert torch.equal(comm.gather(halves, dim=1, destination="cpu"), x)
    target = torch.empty(6, 2)
    assert comm.gather(parts, out=target) is target and torch.equal(target, x)
    with pytest.raises(RuntimeError, match="not the expected"):
        comm.gather(parts, out=torch.empty(6, 3))
    with pytest.warns(FutureWarning, match="-1 to represent CPU"):
        assert comm.gather(parts, destination=-1).device.type == "cpu"
    # The first tensor's dtype, as CUDA's gather gives.
    mixed = comm.gather([parts[0].half(), parts[1]], destination=1)
    assert mixed.dtype == torch.float16 and torch.equal(mixed.float().cpu(), x)
    with pytest.raises(RuntimeError, match="does not match the first's"):
        comm.gather([parts[0], parts[1].reshape(1, 4)])
    summed = comm.reduce_add([torch.ones(3, device=f"{DEVICE}:{i}") for i in (0, 1)], destination=1)
    assert summed.device == torch.device(DEVICE, 1) and torch.equal(summed.cpu(), torch.full((3,), 2.0))

