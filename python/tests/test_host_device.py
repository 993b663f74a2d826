"""PyTorch on the host accelerator: tensors, models, torch.accelerator, memory figures, errors."""
import gc

import pytest
import torch

import accalloc
from conftest import DEVICE, MiB


def test_it_is_pytorchs_accelerator():
    assert DEVICE == "accalloc"
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "accalloc"
    assert torch.accelerator.device_count() == 2
    assert torch.accalloc.device_count() == 2
    assert torch.device("accalloc:1").type == "accalloc"


def test_current_device_and_the_device_index_context(fresh_device):
    assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(1):
        assert torch.accelerator.current_device_index() == 1
        t = torch.empty(4096, dtype=torch.uint8, device="accalloc")
        assert t.device == torch.device("accalloc:1")
        assert torch.accelerator.memory_allocated(1) == 4096
        assert torch.accelerator.memory_allocated(0) == 0
        del t
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(0)


def test_streams_are_the_default_stream(fresh_device):
    stream = torch.accelerator.current_stream()
    assert stream.device == torch.device("accalloc:0") and stream.stream_id == 0
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)


def test_tensors_compute_and_copy_both_ways(fresh_device):
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    d = a.to("accalloc")
    assert d.device.type == "accalloc"
    assert torch.equal((d * 2 + 1).cpu(), a * 2 + 1)
    assert torch.equal(d.t().contiguous().cpu(), a.t().contiguous())
    assert torch.equal(d[1:, ::2].cpu(), a[1:, ::2])
    assert d.sum().item() == 66.0
    assert torch.equal((d @ d.T).cpu(), a @ a.T)
    d.add_(1)
    assert torch.equal(d.cpu(), a + 1)
    e = torch.zeros(3, 4, device="accalloc:1")
    e.copy_(d)  # across devices
    assert torch.equal(e.cpu(), a + 1)
    assert "accalloc" in repr(d)
    grown = torch.empty(0, device="accalloc")
    grown.resize_(100)
    assert grown.numel() == 100


def test_a_tensor_on_device_1_is_counted_on_device_1_only(fresh_device):
    t = torch.empty(5 * MiB, dtype=torch.uint8, device="accalloc:1")
    assert torch.accelerator.memory_allocated(1) == 5 * MiB
    assert torch.accelerator.memory_reserved(1) == 20 * MiB
    assert torch.accelerator.memory_allocated(0) == 0
    assert torch.accelerator.memory_reserved(0) == 0
    del t
    assert torch.accelerator.memory_allocated(1) == 0
    assert torch.accelerator.max_memory_allocated(1) == 5 * MiB


def test_memory_stats_are_accallocs_at_the_same_moment(fresh_device):
    keep = [torch.empty(n, device="accalloc") for n in (10, 1000, 300_000, 5_000_000)]
    assert torch.accelerator.memory_stats() == accalloc.memory_stats("accalloc:0")
    assert torch.accelerator.memory_stats(0) == accalloc.memory_stats(f"{DEVICE}:0")
    assert len(torch.accelerator.memory_stats()) == 122
    del keep
    assert torch.accelerator.memory_stats() == accalloc.memory_stats("accalloc:0")


def test_figures_of_a_sequence_of_empty_follow_pytorchs_rules(fresh_device):
    # 1000 bytes: rounded to 1024 (512-byte steps), a 2 MiB small-pool segment, split.
    a = torch.empty(1000, dtype=torch.uint8, device="accalloc")
    # 1 MiB exactly: still small (<= 1 MiB), rounded to itself, from the same small segment.
    b = torch.empty(MiB, dtype=torch.uint8, device="accalloc")
    # 3 MiB: large pool; a new 20 MiB segment (requests between 1 and 10 MiB), split.
    c = torch.empty(3 * MiB // 4, dtype=torch.float32, device="accalloc")
    # 18 MiB: more than the 17 MiB left of that segment, so a segment of its own, rounded up to a
    # multiple of 2 MiB (18 MiB), not split.
    d = torch.empty(18 * MiB, dtype=torch.uint8, device="accalloc")
    s = torch.accelerator.memory_stats()
    assert s["allocation.all.current"] == 4
    assert s["allocation.small_pool.current"] == 2 and s["allocation.large_pool.current"] == 2
    assert s["allocated_bytes.small_pool.current"] == 1024 + MiB
    assert s["allocated_bytes.large_pool.current"] == 3 * MiB + 18 * MiB
    assert s["requested_bytes.all.current"] == 1000 + MiB + 3 * MiB + 18 * MiB
    assert s["reserved_bytes.small_pool.current"] == 2 * MiB
    assert s["reserved_bytes.large_pool.current"] == 20 * MiB + 18 * MiB
    assert s["segment.all.current"] == 3 and s["num_device_alloc"] == 3
    # The remainders of the two split segments are inactive splits.
    assert s["inactive_split.small_pool.current"] == 1
    assert s["inactive_split_bytes.small_pool.current"] == 2 * MiB - 1024 - MiB
    assert s["inactive_split.large_pool.current"] == 1
    assert s["inactive_split_bytes.large_pool.current"] == 17 * MiB
    # Freeing b merges it with the small remainder: one inactive split of 2 MiB - 1024.
    del b
    s = torch.accelerator.memory_stats()
    assert s["inactive_split_bytes.small_pool.current"] == 2 * MiB - 1024
    assert s["allocated_bytes.all.freed"] == MiB
    del a, c, d
    s = torch.accelerator.memory_stats()
    assert s["allocated_bytes.all.current"] == 0 and s["reserved_bytes.all.current"] == 40 * MiB
    assert s["allocated_bytes.all.peak"] == 1024 + MiB + 21 * MiB
    assert s["inactive_split.all.current"] == 0  # whole free segments are not splits
    torch.accelerator.empty_cache()
    s = torch.accelerator.memory_stats()
    assert s["reserved_bytes.all.current"] == 0 and s["num_device_free"] == 3
    assert torch.accelerator.max_memory_reserved() == 40 * MiB
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_reserved() == 0
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["num_device_alloc"] == 0


def test_get_memory_info(fresh_device):
    free, total = torch.accelerator.get_memory_info(0)
    assert total == 2 << 30 and free == total
    t = torch.empty(5 * MiB, dtype=torch.uint8, device="accalloc")
    free, total = torch.accelerator.get_memory_info(0)
    assert free == total - 20 * MiB
    del t


def test_torch_cudas_names_on_the_device_module(fresh_device):
    # What CUDA-minded code asks of torch.get_device_module(device) (torch.cuda's names), each
    # answered with the device's own figures, on the device asked for.
    module = torch.get_device_module("accalloc")
    assert module is torch.accalloc
    with torch.accelerator.device_index(1):
        assert module.current_stream().device == torch.device("accalloc:1")
        assert module.default_stream(0).device == torch.device("accalloc:0")
        assert module.Stream().device == torch.device("accalloc:1")
        event = module.Event(enable_timing=True)
        event.record()  # an event takes its device when recorded, as a CUDA event does
        assert event.device == torch.device("accalloc:1") and event.query()
        assert module.mem_get_info() == torch.accelerator.get_memory_info(1)
    assert module.mem_get_info(1) == accalloc.get_memory_info("accalloc:1")
    properties = module.get_device_properties(1)
    assert (properties.name, properties.index) == ("accalloc host", 1)
    assert properties.total_memory == torch.accelerator.get_memory_info(1)[1] > 0
    assert module.get_device_name() == "accalloc host"
    side = module.Stream()
    with module.stream(side):
        assert module.current_stream() == side
    with module.stream(None):
        assert module.current_stream().device == torch.device("accalloc:0")
    t = torch.empty(MiB, dtype=torch.uint8, device="accalloc")
    assert [s["total_size"] for s in module.memory_snapshot()] == [2 * MiB]
    assert module.memory_allocated() == MiB
    del t
    # The fraction caps this device's reserved memory: a request over it fails as out of memory.
    total = module.get_device_properties(0).total_memory
    module.set_per_process_memory_fraction(0.5, 0)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(total // 2 + 2 * MiB, dtype=torch.uint8, device="accalloc:0")
        torch.empty(total // 2 + 2 * MiB, dtype=torch.uint8, device="accalloc:1")
    finally:
        module.set_per_process_memory_fraction(1.0, 0)
    with pytest.raises(RuntimeError, match="device 7 does not exist"):
        module.get_device_name(7)


def test_seeding_the_device_module_makes_its_numbers_repeat(fresh_device):
    # torch.cuda.manual_seed(s) is how CUDA code makes a device's numbers repeat. The device draws from
    # the CPU's default generator (so that it gives the CPU's numbers for a seed): seeding it seeds that.
    module = torch.accalloc
    module.manual_seed(3)
    first = torch.randn(5, device="accalloc").cpu()
    module.manual_seed_all(3)
    assert torch.equal(torch.randn(5, device="accalloc").cpu(), first)
    torch.manual_seed(3)
    assert torch.equal(torch.randn(5), first), "the CPU's numbers for the same seed"
    assert module.initial_seed() == torch.initial_seed() == 3
    module.seed()
    assert module.initial_seed() != 3
    states = module.get_rng_state_all()
    assert len(states) == 2 and all(torch.equal(state, torch.get_rng_state()) for state in states)
    drawn = torch.rand(4, device="accalloc:1").cpu()
    module.set_rng_state_all(states)
    assert torch.equal(torch.rand(4, device="accalloc:1").cpu(), drawn)


def test_torch_cudas_memory_names_on_the_device_module(fresh_device):
    module = torch.accalloc
    # The fraction reads back as PyTorch's does: the bytes allowed over the total, 1.0 when none is set.
    assert module.get_per_process_memory_fraction() == module.get_per_process_memory_fraction(1) == 1.0
    module.set_per_process_memory_fraction(0.25, 1)
    try:
        assert module.get_per_process_memory_fraction(1) == 0.25
        assert module.get_per_process_memory_fraction("accalloc:0") == 1.0
        assert accalloc.get_per_process_memory_fraction("accalloc:1") == 0.25
    finally:
        module.set_per_process_memory_fraction(1.0, 1)
    assert module.get_per_process_memory_fraction(1) == 1.0
    with pytest.raises(RuntimeError, match="device 7 does not exist"):
        module.get_per_process_memory_fraction(7)
    # Raw memory from the device's cache, counted as a tensor's is, on the device asked for.
    address = module.caching_allocator_alloc(1000, 1, module.current_stream(1))
    assert address != 0 and module.memory_allocated(1) == 1024 and module.memory_allocated(0) == 0
    assert module.memory_stats(1)["allocation.all.current"] == 1
    module.caching_allocator_delete(address)
    assert module.memory_allocated(1) == 0
    with pytest.raises(accalloc.AccallocError, match="already freed"):
        module.caching_allocator_delete(address)
    assert module.caching_allocator_alloc(0) == 0
    module.caching_allocator_delete(0)
    with pytest.raises(ValueError, match="0 bytes or more"):
        module.caching_allocator_alloc(-1)
    # A device of another type, or an index below -1, is refused, not taken for the current device.
    with pytest.raises(ValueError, match="Expected a accalloc device, but got: cpu"):
        module.caching_allocator_alloc(8, "cpu")
    with pytest.raises(ValueError, match="index of -1 .* or more, but got: -2"):
        module.get_per_process_memory_fraction(-2)
    assert module.memory_allocated(0) == module.memory_allocated(1) == 0
    # The nested form of memory_stats(), and torch.cuda's deprecated names, which warn as there.
    t = torch.empty(MiB, dtype=torch.uint8, device="accalloc")
    nested = module.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == MiB == module.memory_stats()["allocated_bytes.all.current"]
    assert nested["num_device_alloc"] == module.memory_stats()["num_device_alloc"] == 1
    # Pinned blocks an earlier test used in a non-blocking copy are freed once their events are seen
    # (PyTorch's rule): emptying the host cache sees them.
    torch.accelerator.empty_host_cache()
    host_nested = module.host_memory_stats_as_nested_dict()
    assert host_nested["allocations"]["current"] == 0 == accalloc.torch.host_memory_stats()["allocations.current"]
    pinned = torch.empty(1024, pin_memory=True)  # 4 KiB, a power of two: kept as asked
    host_nested = module.host_memory_stats_as_nested_dict()
    assert host_nested["allocations"]["current"] == 1 and host_nested["allocated_bytes"]["current"] == 4096
    del pinned
    with pytest.warns(FutureWarning, match="memory_reserved"):
        assert module.memory_cached() == module.memory_reserved() == 2 * MiB
    with pytest.warns(FutureWarning, match="max_memory_reserved"):
        assert module.max_memory_cached() == 2 * MiB
    del t
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        module.reset_max_memory_allocated()
    assert module.max_memory_allocated() == 0
    # Private pools under torch.cuda's names, and what else CUDA code asks before it starts.
    pool = module.MemPool()
    with module.use_mem_pool(pool):
        pooled = torch.empty(MiB, dtype=torch.uint8, device="accalloc")
    assert [s["segment_pool_id"] for s in pool.snapshot()] == [list(pool.id)]
    del pooled
    assert module.is_bf16_supported() and module.init() is None


def test_the_memory_history_for_pytorchs_memory_viewer(fresh_device, tmp_path):
    # torch.cuda.memory's way to a file for pytorch.org/memory_viz, on the device module: record the
    # history, then a snapshot pickled; PyTorch's own viewer code reads it.
    import pickle

    from torch.cuda import _memory_viz

    memory = torch.get_device_module("accalloc").memory
    assert memory.memory_allocated is torch.accalloc.memory_allocated
    memory._record_memory_history(max_entries=1000)
    try:
        t = torch.empty(MiB, dtype=torch.uint8, device="accalloc")
        address = t.data_ptr()
        del t
        snapshot = memory._snapshot()
        memory._dump_snapshot(str(tmp_path / "snapshot.pickle"))
    finally:
        memory._record_memory_history(enabled=None)
    # Device 0's history: the small pool's 2 MiB segment, then the tensor's allocation and free.
    trace = snapshot["device_traces"][0]
    assert [(e["action"], e["size"]) for e in trace if e["action"] == "segment_alloc"] == [("segment_alloc", 2 * MiB)]
    assert [(e["action"], e["size"]) for e in trace if e["addr"] == address and "segment" not in e["action"]] == [
        ("alloc", MiB), ("free_requested", MiB), ("free_completed", MiB)]
    assert snapshot["device_traces"][1] == []
    assert [s["total_size"] for s in snapshot["segments"]] == [2 * MiB]
    with open(tmp_path / "snapshot.pickle", "rb") as f:
        dumped = pickle.load(f)
    assert dumped["segments"] == snapshot["segments"] and dumped["device_traces"] == snapshot["device_traces"]
    assert "total_reserved: 2.0MiB" in _memory_viz.segsum(dumped)
    assert "<html" in _memory_viz.trace_plot(dumped).lower()
    # Stopped, the history is gone (as PyTorch clears it) and nothing more is recorded; "state"
    # records none either.
    assert memory._snapshot()["device_traces"][0] == []
    torch.empty(MiB, device="accalloc")
    memory._record_memory_history("state")
    torch.empty(MiB, device="accalloc")
    assert memory._snapshot()["device_traces"][0] == []
    with pytest.raises(ValueError, match="enabled must be None"):
        memory._record_memory_history("everything")
    for bad in (-5, 1.5, "10", True):
        with pytest.raises(TypeError, match="max_entries must be an int"):
            memory._record_memory_history(max_entries=bad)
        with pytest.raises(TypeError, match="max_entries must be an int"):
            accalloc.record_memory_history(True, bad if bad != -5 else 2.0)
    with pytest.raises(ValueError, match="max_entries must be 1 or more"):
        accalloc.record_memory_history(True, 0)
    # 0 keeps the newest entry, as in PyTorch.
    memory._record_memory_history(max_entries=0)
    try:
        torch.empty(MiB, device="accalloc")
        assert len(memory._snapshot()["device_traces"][0]) == 1
    finally:
        memory._record_memory_history(enabled=None)


def _allocate_a_mebibyte():
    return torch.empty(MiB, dtype=torch.uint8, device="accalloc")


def _let_go(tensors):
    tensors.clear()


@pytest.mark.parametrize("context", ["all", "alloc", None])
def test_the_memory_history_has_the_python_stack_of_each_allocation_and_free(fresh_device, context):
    # As torch.cuda.memory's history: each event, and each live block, with the Python stack that made
    # it, innermost frame first (context "alloc": allocations only; None: no stacks).
    memory = torch.accalloc.memory
    memory._record_memory_history(context=context, max_entries=1000)
    try:
        tensors = [_allocate_a_mebibyte(), _allocate_a_mebibyte()]
        kept, freed = tensors[0].data_ptr(), tensors[1].data_ptr()
        held = tensors[0]
        _let_go(tensors)
        snapshot = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][0]

    def innermost(action, address):
        frames = [e["frames"] for e in trace if e["action"] == action and e["addr"] == address]
        assert len(frames) == 1
        return (frames[0][0]["name"], frames[0][0]["filename"]) if frames[0] else None

    here = __file__
    made = ("_allocate_a_mebibyte", here) if context else None
    assert innermost("alloc", kept) == innermost("alloc", freed) == made
    # The segment the first allocation mapped has that allocation's stack.
    assert innermost("segment_alloc", trace[0]["addr"]) == made
    let_go = ("_let_go", here) if context == "all" else None
    assert innermost("free_requested", freed) == innermost("free_completed", freed) == let_go
    block = next(b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == kept)
    assert block["state"] == "active_allocated"
    assert (block["frames"][0]["name"] if block["frames"] else None) == (made[0] if made else None)
    if context:
        assert block["frames"][0]["line"] == _allocate_a_mebibyte.__code__.co_firstlineno + 1
    del held


def test_stacks_are_recorded_from_threads_and_backward_passes_while_snapshots_are_taken(fresh_device):
    # Stacks are gathered under the GIL and kept under a lock of their own: threads allocating and
    # freeing (and the autograd engine's thread, which holds no GIL) against snapshots and restarts of
    # the recording must neither deadlock nor lose an event.
    import threading
    import time

    memory = torch.accalloc.memory
    memory._record_memory_history(max_entries=2000)
    stop = threading.Event()
    errors = []

    def work(k):
        try:
            layer = torch.nn.Linear(16, 16).to("accalloc")
            while not stop.is_set():
                layer(torch.randn(8, 16, device="accalloc", requires_grad=True)).sum().backward()
                tensors = [torch.empty(100 + k, device="accalloc") for _ in range(5)]
                del tensors
        except Exception as e:  # reported below: a thread's exception would be lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    try:
        snapshots = 0
        end = time.monotonic() + 3
        while time.monotonic() < end:
            snapshot = memory._snapshot()
            snapshots += 1
            if snapshots % 5 == 0:
                memory._record_memory_history(max_entries=2000)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        memory._record_memory_history(enabled=None)
    assert not any(thread.is_alive() for thread in threads) and not errors
    trace = snapshot["device_traces"][0]
    assert trace and all(isinstance(e["frames"], list) for e in trace)
    # The threads' own allocations (not the backward passes') have their frames.
    assert any(f["name"] == "work" for e in trace if e["action"] == "alloc" for f in e["frames"])


def test_a_child_forked_while_stacks_are_recorded_lets_go_of_its_tensors_and_exits(fresh_device):
    # fork() copies the stacks' lock as some thread held it; the child must not wait for it. It lets
    # go of the tensors it inherited and is refused a new one (accalloc refuses a fork child's
    # requests, as CUDA does: its error, not a hang), so the recorder is never called there.
    import os
    import threading

    memory = torch.accalloc.memory
    memory._record_memory_history(max_entries=1000)
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            del [torch.empty(64, device="accalloc") for _ in range(10)][:]

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        inherited = [torch.ones(100, device="accalloc") for _ in range(5)]
        statuses = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:  # the child: let go, try to allocate, and leave at once
                code = 1
                try:
                    inherited.clear()
                    try:
                        torch.ones(10, device="accalloc")
                    except RuntimeError as e:
                        code = 0 if "fork() child" in str(e) else 2
                finally:
                    os._exit(code)
            statuses.append(os.waitpid(pid, 0)[1])
    finally:
        stop.set()
        thread.join()
        memory._record_memory_history(enabled=None)
    assert statuses == [0] * 5
    del inherited


def test_out_of_memory_is_torchs_error_and_the_allocator_keeps_working(fresh_device):
    keep = torch.empty(MiB, device="accalloc")
    with pytest.raises(torch.OutOfMemoryError, match="out of memory. Tried to allocate 3.00 GiB"):
        torch.empty(3 << 30, dtype=torch.uint8, device="accalloc")
    # The allocator keeps working: 1.5 GiB still fits beside what it holds, and the failed request
    # left no trace but the OOM count.
    assert torch.accelerator.memory_allocated() == 4 * MiB
    big = torch.empty(3 << 29, dtype=torch.uint8, device="accalloc")
    s = torch.accelerator.memory_stats()
    assert s["num_ooms"] == 1
    assert torch.accelerator.memory_allocated() == 4 * MiB + (3 << 29)
    del big, keep


@pytest.mark.parametrize("call", [
    lambda: torch.accelerator.set_device_index(2),
    lambda: torch.accelerator.set_device_index(100),
    lambda: torch.accelerator.memory_stats(2),
    lambda: torch.accelerator.memory_allocated(5),
    lambda: torch.accelerator.reset_peak_memory_stats(2),
    lambda: torch.accelerator.get_memory_info(2),
    lambda: torch.empty(4, device="accalloc:2"),
    lambda: torch.ones(4).to("accalloc:3"),
    lambda: torch.accelerator.synchronize(2),
], ids=["set_device_index(2)", "set_device_index(100)", "memory_stats(2)", "memory_allocated(5)",
        "reset_peak_memory_stats(2)", "get_memory_info(2)", "empty on accalloc:2", "to accalloc:3", "synchronize(2)"])
def test_a_device_index_out_of_range_is_pytorchs_runtime_error(fresh_device, call):
    # CUDA and PyTorch's reference out-of-tree backend (torch_openreg) raise RuntimeError, and code
    # written for PyTorch catches that: not an IndexError (which is no RuntimeError).
    with pytest.raises(RuntimeError, match=r"The device index is out of range.*indices 0 to 1") as error:
        call()
    assert not isinstance(error.value, IndexError)
    # Nothing changed: the current device and the books are as they were.
    assert torch.accelerator.current_device_index() == 0
    assert torch.accelerator.memory_allocated(0) == torch.accelerator.memory_allocated(1) == 0


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))


class TransformerBlock(torch.nn.Module):
    def __init__(self, width=32, heads=4):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(width)
        self.feed_forward = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                torch.nn.Linear(4 * width, width))
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        x = x + self.feed_forward(self.norm2(x))
        return self.head(x.mean(dim=1))


def train(model, inputs, targets, device, steps=8):
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        x, y = inputs[step].to(device), targets[step].to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("make, shape", [(mlp, (32, 16)), (TransformerBlock, (8, 10, 32))],
                         ids=["mlp", "transformer_block"])
def test_a_model_trains_with_the_losses_of_the_cpu_and_nothing_leaks(fresh_device, make, shape):
    torch.manual_seed(0)
    reference = make()
    inputs = [torch.randn(*shape) for _ in range(8)]
    targets = [torch.randint(0, 4, (shape[0],)) for _ in range(8)]
    on_device = make()
    on_device.load_state_dict(reference.state_dict())
    cpu_losses = train(reference, inputs, targets, "cpu")
    device_losses = train(on_device, inputs, targets, "accalloc")
    assert device_losses == pytest.approx(cpu_losses, rel=1e-5, abs=1e-6)
    assert device_losses[-1] < device_losses[0], "the model learns"
    assert torch.accelerator.max_memory_allocated() > 0
    assert torch.accelerator.memory_stats() == accalloc.memory_stats("accalloc:0")
    del on_device
    gc.collect()
    assert torch.accelerator.memory_allocated() == 0
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == 0


def test_oversize_and_max_split_size_reach_torch(fresh_device):
    before = accalloc.get_allocator_settings("host")
    accalloc.set_allocator_settings("max_split_size_mb:20", "host")
    try:
        big = torch.empty(25 * MiB, dtype=torch.uint8, device="accalloc")  # 25 MiB >= 20 MiB: oversize
        s = torch.accelerator.memory_stats()
        assert s["max_split_size"] == 20 * MiB
        assert s["oversize_allocations.current"] == 1 and s["oversize_segments.current"] == 1
        assert s["inactive_split.all.current"] == 0, "an oversize block is never split"
        del big
        s = torch.accelerator.memory_stats()
        assert s["oversize_allocations.current"] == 0 and s["oversize_allocations.freed"] == 1
    finally:
        accalloc.set_allocator_settings(before, "host")
        torch.accelerator.empty_cache()
    assert torch.accelerator.memory_stats()["max_split_size"] == -1


def test_conjugate_and_negative_views_copy_with_their_bits(fresh_device):
    # A conjugate or negative view reaching the device's copy once recursed until the process died.
    y = torch.randn(4, dtype=torch.complex64)
    on_device = y.to("accalloc")
    assert torch.equal(on_device.conj().cpu(), y.conj())
    assert torch.equal(on_device.conj().resolve_conj().cpu(), y.conj())
    assert not on_device.conj().resolve_conj().is_conj()
    assert torch.allclose((on_device.conj() + 1).cpu(), y.conj() + 1)
    real = torch.randn(4)
    assert torch.equal(real.to("accalloc")._neg_view().cpu(), -real)
    assert torch.equal(real.to("accalloc")._neg_view().resolve_neg().cpu(), -real)
    # Into a conjugate view: the bytes hold the conjugate of what was written.
    target = torch.zeros(4, dtype=torch.complex64, device="accalloc")
    target.conj().copy_(on_device)
    assert torch.equal(target.cpu(), y.conj())
    del on_device, target


@pytest.mark.parametrize("name, shape", [("ifft", (8,)), ("hfft", (8,)), ("ihfft", (8,)), ("hfft2", (4, 6)),
                                         ("hfftn", (4, 6))])
def test_the_ffts_that_crashed_give_the_cpus_results(fresh_device, name, shape):
    x = torch.randn(*shape)
    fft = getattr(torch.fft, name)
    assert torch.allclose(fft(x.to("accalloc")).cpu(), fft(x), atol=1e-4)


def test_writes_through_views_reach_the_base(fresh_device):
    # The boxed CPU fallback returns copies: these views were copies, and writes through them lost.
    x = torch.zeros(8, device="accalloc")
    x.unfold(0, 2, 2).add_(1)
    assert x.cpu().tolist() == [1.0] * 8
    y = torch.zeros(8, device="accalloc")
    torch.view_as_complex(y.view(4, 2)).add_(1)
    assert y.cpu().tolist() == [1.0, 0.0] * 4
    z = torch.zeros(4, dtype=torch.complex64, device="accalloc")
    torch.view_as_real(z).add_(1)
    assert z.cpu().tolist() == [1 + 1j] * 4
    del x, y, z


def test_every_view_operator_with_a_backend_kernel_has_the_devices():
    # A view operator (an output aliasing an input, not written) that has a CPU kernel and no
    # composite one reaches the boxed fallback unless the device registers it; nested tensors, which
    # this device does not hold, are the exception.
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    composite = ("CompositeImplicitAutograd", "CompositeExplicitAutograd",
                 "CompositeExplicitAutogradNonFunctional", "PrivateUse1")
    missing = []
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::") or "nested" in schema.name:
            continue
        if not any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            continue
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        try:
            if not has(name, "CPU") or any(has(name, key) for key in composite):
                continue
        except RuntimeError:  # a schema the dispatcher does not register (a JIT builtin)
            continue
        missing.append(name)
    assert missing == []
