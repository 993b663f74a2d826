"""torch.accelerator.Graph on the accalloc device: a capture records the device's work, a replay runs it
again on the inputs as they are then (results against eager ones and the CPU's), the capture leaves
what it found unchanged, and its memory lives in the graph's private pool by PyTorch's rules; work
another thread does during a capture is part of it, and a graph dropped mid-capture leaves no capture
behind."""
import copy
import gc
import threading

import pytest
import torch

import accalloc
from conftest import MiB


def pools_of_segments():
    return sorted(tuple(s["segment_pool_id"]) for s in accalloc.memory_snapshot("accalloc")["segments"])


def test_a_replay_computes_on_the_inputs_as_they_are_then(fresh_device):
    x = torch.ones(4, device="accalloc")
    w = torch.full((4,), 2.0, device="accalloc")
    graph = torch.accelerator.Graph()
    with graph:
        y = x * w + 1
        z = y.relu().sum()
    for value in (3.0, -5.0, 0.5):
        x.fill_(value)
        graph.replay()
        assert torch.equal(y.cpu(), torch.full((4,), value * 2 + 1))
        assert z.item() == max(value * 2 + 1, 0) * 4


def test_the_capture_changes_nothing_it_found_and_each_replay_does(fresh_device):
    # As on CUDA, where a capture runs nothing: only replays change the tensors the work writes.
    total = torch.zeros(3, device="accalloc")
    graph = torch.accelerator.Graph()
    with graph:
        total += 1
        total.mul_(2)
    assert torch.equal(total.cpu(), torch.zeros(3))
    graph.replay()
    graph.replay()
    assert torch.equal(total.cpu(), torch.full((3,), 6.0))  # (0 + 1) * 2, then (2 + 1) * 2


def test_a_whole_training_step_replays_as_the_cpus_eager_steps(fresh_device):
    # PyTorch's whole-network recipe: warm up, capture forward, backward and the optimizer's step
    # on static tensors, then copy each batch in and replay.
    torch.manual_seed(0)
    on_cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                 torch.nn.Linear(4 * 6 * 6, 2))
    on_device = copy.deepcopy(on_cpu).to("accalloc")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (on_device, on_cpu)]
    loss_fn = torch.nn.MSELoss()
    batches = [(torch.randn(2, 3, 8, 8), torch.randn(2, 2)) for _ in range(6)]

    def eager_step(model, optimizer, x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    for x, y in batches[:2]:
        eager_step(on_device, optimizers[0], x.to("accalloc"), y.to("accalloc"))
        eager_step(on_cpu, optimizers[1], x, y)
    static_x = torch.zeros(2, 3, 8, 8, device="accalloc")
    static_y = torch.zeros(2, 2, device="accalloc")
    graph = torch.accelerator.Graph()
    optimizers[0].zero_grad(set_to_none=True)
    with graph:
        static_loss = loss_fn(on_device(static_x), static_y)
        static_loss.backward()
        optimizers[0].step()
    for x, y in batches[2:]:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        loss = eager_step(on_cpu, optimizers[1], x, y)
        assert static_loss.item() == pytest.approx(loss.item(), rel=1e-6)
        for a, b in zip(on_device.parameters(), on_cpu.parameters()):
            torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)


def test_the_capture_allocates_in_the_graphs_pool_which_reset_gives_back(fresh_device):
    x = torch.ones(128, device="accalloc")  # 512 bytes: a 2 MiB small segment of the default pool
    graph = torch.accelerator.Graph()
    with graph:
        y = x * 2  # 512 bytes in the graph's own pool: a small segment of its own
    first, second = graph.pool()
    assert first >= 1 and second == 0  # a graph's own pool is {n, 0}, as PyTorch numbers them
    assert pools_of_segments() == [(0, 0), (first, 0)]
    assert torch.accelerator.memory_allocated() == 1024
    assert torch.accelerator.memory_reserved() == 4 * MiB
    # A replay's intermediate results come and go in the default pool; the books end as they began.
    graph.replay()
    assert torch.accelerator.memory_allocated() == 1024
    assert torch.accelerator.memory_reserved() == 4 * MiB
    # Another graph may share the pool.
    shared = torch.accelerator.Graph(pool=graph.pool())
    with shared:
        w = y + 1
    assert shared.pool() == graph.pool()
    assert pools_of_segments() == [(0, 0), (first, 0)]
    shared.replay()
    assert torch.equal(w.cpu(), torch.full((128,), 3.0))
    # The pool goes once no graph uses it and its blocks are free.
    del y, w
    graph.reset()
    shared.reset()
    torch.accelerator.empty_cache()
    assert pools_of_segments() == [(0, 0)]
    assert torch.accelerator.memory_reserved() == 2 * MiB


def test_reading_a_value_during_a_capture_is_refused_and_the_device_goes_on(fresh_device):
    x = torch.ones(4, device="accalloc")
    graph = torch.accelerator.Graph()
    with pytest.raises(RuntimeError, match="during a graph capture"):
        with graph:
            (x * 2).sum().item()
    assert (x * 3).sum().item() == 12
    with pytest.raises(RuntimeError, match="captured already"):
        graph.capture_begin()
    graph.reset()
    with graph:
        y = x + 1
    graph.replay()
    assert torch.equal(y.cpu(), torch.full((4,), 2.0))
    with pytest.raises(RuntimeError, match="not been captured"):
        torch.accelerator.Graph().replay()


def test_work_another_thread_does_during_a_capture_is_part_of_it(fresh_device):
    # The device has one stream: as on a capturing CUDA stream, whatever runs on it is captured, here
    # from any thread (the backward pass's own thread among them).
    x = torch.ones(2, device="accalloc")
    made = {}

    def other_thread():
        made["y"] = x * 5

    graph = torch.accelerator.Graph()
    with graph:
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    x.fill_(2.0)
    graph.replay()
    assert torch.equal(made["y"].cpu(), torch.full((2,), 10.0))


def test_a_graph_dropped_while_capturing_leaves_the_device_as_it_was(fresh_device):
    x = torch.ones(4, device="accalloc")
    graph = torch.accelerator.Graph()
    graph.capture_begin()
    y = x * 2
    del graph
    gc.collect()
    # No capture is underway: the device computes, allocates in its default pool, and captures anew.
    assert (x * 3).sum().item() == 12
    again = torch.accelerator.Graph()
    with again:
        z = x + 1
    again.replay()
    assert torch.equal(z.cpu(), torch.full((4,), 2.0))
    del y, z, again
    gc.collect()
    torch.accelerator.empty_cache()
    assert pools_of_segments() == [(0, 0)]
