"""accalloc as PyTorch's CUDA allocator, with PyTorch's statistics kept. Needs a GPU: without one each
test skips, saying so (scripts/gpu-check.sh runs them where there is one)."""
import pytest
import torch

from conftest import run_python as run_python_here


def run_python(code):
    """`code` in a fresh interpreter on the GPU: conftest keeps this process on the host accelerator
    (ACCALLOC_DEVICE=host), which a child would inherit and which leaves CUDA out of accalloc."""
    return run_python_here(code, ACCALLOC_DEVICE="cuda")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU on this machine: accalloc.torch.use_for_cuda is tested by "
                                       "scripts/gpu-check.sh on one")


def test_cuda_statistics_are_accallocs():
    code, out = run_python("""
        import torch, accalloc, accalloc.torch
        accalloc.torch.use_for_cuda()
        MiB = 1 << 20
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(1000, dtype=torch.uint8, device="cuda")
        s = torch.cuda.memory_stats()
        assert s == accalloc.memory_stats("cuda:0"), "torch.cuda.memory_stats is accalloc's"
        assert torch.accelerator.memory_stats() == s, "and so is torch.accelerator's"
        assert s["allocated_bytes.all.current"] == 3 * MiB + 1024
        assert s["reserved_bytes.large_pool.current"] == 20 * MiB
        assert torch.cuda.max_memory_allocated() == 3 * MiB + 1024
        del a, b
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == 0
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0
        assert "Allocated memory" in torch.cuda.memory_summary()
        free, total = torch.cuda.mem_get_info()
        assert 0 < free <= total
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            assert "out of memory" in str(e)
        else:
            raise AssertionError("no OOM")
        assert torch.cuda.memory_stats()["num_ooms"] == 1
        x = torch.randn(256, 256, device="cuda")
        assert torch.isfinite((x @ x).sum()).item()
        print("cuda ok")
    """)
    assert code == 0 and "cuda ok" in out, out


def test_the_memory_profiler_sees_cuda_memory_under_use_for_cuda():
    # PyTorch's pluggable allocator reports nothing to torch.profiler; accalloc reports each
    # allocation and free with the bytes it counts, as CUDA's own allocator does.
    code, out = run_python("""
        import torch, accalloc.torch
        from torch.profiler import ProfilerActivity, profile
        accalloc.torch.use_for_cuda()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
            small = torch.empty(1000, dtype=torch.uint8, device="cuda")
            large = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            del small, large
        made = [e.device_memory_usage for e in prof.events() if e.name == "aten::empty"]
        freed = [e.device_memory_usage for e in prof.events() if e.name == "[memory]" and e.device_memory_usage]
        assert made == [1024, 3 << 20] and freed == [-1024, -(3 << 20)], (made, freed)
        print("ok")
    """)
    assert code == 0 and "ok" in out.splitlines(), out


def test_use_for_cuda_too_late_says_what_to_do():
    code, out = run_python("""
        import torch, accalloc.torch
        torch.empty(10, device="cuda")
        accalloc.torch.use_for_cuda()
    """)
    assert code != 0
    assert "before the first CUDA tensor" in out, out
    assert "frame #" not in out, "c10's message without its C++ backtrace"


def test_sleep_and_wake_on_cuda_with_use_for_cuda():
    code, out = run_python("""
        import torch, accalloc.torch
        accalloc.torch.use_for_cuda()
        MiB = 1 << 20
        with accalloc.torch.region("weights", enable_cpu_backup=True):
            weights = torch.arange(5 * MiB // 4, dtype=torch.int32, device="cuda")
        with accalloc.torch.region("kv_cache"):
            cache = torch.zeros(3 * MiB // 4, device="cuda")
        address = weights.data_ptr()
        allocated = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
        running = torch.cuda.mem_get_info()[0]
        accalloc.torch.pause()
        paused = accalloc.torch.paused_bytes()
        assert paused >= 5 * MiB + 3 * MiB, paused
        assert torch.cuda.mem_get_info()[0] - running == paused, "the driver got the pages back"
        assert torch.cuda.memory_allocated() == allocated, "the books describe the blocks"
        accalloc.torch.resume()
        assert torch.cuda.mem_get_info()[0] == running
        assert weights.data_ptr() == address
        assert torch.equal(weights.cpu(), torch.arange(5 * MiB // 4, dtype=torch.int32)), "the backup came back"
        cache.fill_(1.0)
        assert float(cache.sum()) == 3 * MiB // 4
        print("cuda sleep ok")
    """)
    assert code == 0 and "cuda sleep ok" in out, out


def test_torch_compile_reduce_overhead_through_use_for_cuda():
    """CUDA graph trees through accalloc: the pool's live blocks checked, checkpoints taken and put
    back (scripts/gpu/compile_reduce_overhead.py: an inference loop, and a training loop whose second
    module changes, so that a graph is recorded after a replay), eager's results at every step."""
    pytest.importorskip("triton", reason="torch.compile's CUDA graphs need Triton")
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "compile_reduce_overhead.py"
    if not script.exists():
        pytest.skip(f"{script} is not in this checkout")
    done = subprocess.run([sys.executable, str(script), "accalloc"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "ACCALLOC_DEVICE": "cuda"})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "accalloc: training: eager's outputs at every step" in done.stdout, done.stdout
