"""The accalloc package over the C ABI, and its errors: what a user sees before any registration."""
import ctypes
import importlib.metadata

import pytest

import accalloc
from conftest import MiB, run_python


def test_memory_api_has_torch_accelerators_names_and_figures(fresh_device):
    stats = accalloc.memory_stats("host:0")
    assert len(stats) == 122 and list(stats) == sorted(stats)
    lib = accalloc._library.library()
    ptr = ctypes.c_void_p()
    # 3 MiB on host device 0: a 20 MiB large-pool segment, split (PyTorch's rules).
    accalloc.check(lib.accalloc_malloc_on(0, ctypes.byref(ptr), 3 * MiB, 0, None))
    try:
        assert accalloc.memory_allocated("host:0") == 3 * MiB
        assert accalloc.memory_reserved("host:0") == 20 * MiB
        stats = accalloc.memory_stats("host:0")
        assert stats["inactive_split_bytes.large_pool.current"] == 17 * MiB
        assert stats["segment.large_pool.current"] == 1
        assert accalloc.device_stats("host:0").allocated_bytes[0].current == 3 * MiB
        assert accalloc.memory_allocated("host:1") == 0
        free, total = accalloc.get_memory_info("host:0")
        assert total == 2 << 30 and free == total - 20 * MiB
        assert "Allocated memory" in accalloc.memory_summary("host:0")
    finally:
        accalloc.check(lib.accalloc_free(ptr))
    assert accalloc.max_memory_allocated("host:0") == 3 * MiB
    accalloc.reset_peak_memory_stats("host:0")
    assert accalloc.max_memory_allocated("host:0") == 0
    accalloc.empty_cache()
    assert accalloc.memory_reserved("host:0") == 0
    assert accalloc.memory_stats("host:0")["num_device_free"] == 1
    accalloc.reset_accumulated_memory_stats("host:0")
    assert accalloc.memory_stats("host:0")["num_device_free"] == 0


def test_memory_snapshot_has_torchs_keys(fresh_device):
    lib = accalloc._library.library()
    ptr = ctypes.c_void_p()
    accalloc.check(lib.accalloc_malloc_on(0, ctypes.byref(ptr), 3 * MiB, 0, None))
    try:
        snapshot = accalloc.memory_snapshot("host")
        assert {"segments", "device_traces", "allocator_settings"} <= set(snapshot)
        (segment,) = [s for s in snapshot["segments"] if s["device"] == 0]
        assert segment["total_size"] == 20 * MiB and segment["allocated_size"] == 3 * MiB
        assert [b["state"] for b in segment["blocks"]] == ["active_allocated", "inactive"]
        # accalloc's own keys only where they say something: no pages paused, no plan.
        assert "paused_size" not in segment and "planned_range" not in segment
    finally:
        accalloc.check(lib.accalloc_free(ptr))
    accalloc.empty_cache()


def test_a_text_that_grows_between_its_two_calls_is_asked_for_again():
    # What a snapshot does when another thread allocates between the length and the copy.
    texts = [b"short", b"grown longer"]
    calls = []

    def call(buffer, capacity, length):
        text = texts[min(len(calls), 1)] if buffer is not None else texts[0]
        calls.append(capacity)
        length._obj.value = len(text) + 1
        if buffer is None:
            return 0
        if capacity < len(text) + 1:
            return accalloc._library.ACCALLOC_ERROR_BUFFER_TOO_SMALL
        ctypes.memmove(buffer, text + b"\0", len(text) + 1)
        return 0

    assert accalloc._text(call) == "grown longer"
    assert calls == [0, 6, 13]
    header = (accalloc._library._HEADER).read_text()
    assert f"ACCALLOC_ERROR_BUFFER_TOO_SMALL = {accalloc._library.ACCALLOC_ERROR_BUFFER_TOO_SMALL}," in header


def test_settings_round_trip_and_bad_settings_are_errors():
    before = accalloc.get_allocator_settings("host")
    accalloc.set_allocator_settings("max_split_size_mb:64", "host")
    try:
        assert "max_split_size_mb:64" in accalloc.get_allocator_settings("host")
        assert accalloc.memory_stats("host:0")["max_split_size"] == 64 * MiB
        with pytest.raises(accalloc.AccallocError, match="max_split_size_mb") as error:
            accalloc.set_allocator_settings("max_split_size_mb:5", "host")
        assert error.value.status == "ACCALLOC_ERROR_CONFIG"
    finally:
        accalloc.set_allocator_settings(before, "host")


def test_device_arguments():
    assert accalloc.device_count("host") == 2
    with pytest.raises(accalloc.AccallocError) as error:
        accalloc.memory_allocated("host:7")
    assert error.value.status == "ACCALLOC_ERROR_INVALID_DEVICE"
    with pytest.raises(ValueError, match="no device of type 'xpu'"):
        accalloc.memory_stats("xpu:0")


def test_a_missing_library_says_what_to_do():
    code, out = run_python("import accalloc", ACCALLOC_LIBRARY="/nonexistent/libaccalloc.so")
    assert code != 0
    assert "ACCALLOC_LIBRARY=/nonexistent/libaccalloc.so does not exist" in out


def test_importing_changes_nothing_in_pytorch():
    code, out = run_python("""
        import torch, accalloc, accalloc.torch
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        accelerator = torch.accelerator.current_accelerator()
        assert accelerator is None or accelerator.type != "accalloc", accelerator
        print("untouched")
    """)
    assert code == 0 and "untouched" in out, out


def test_a_second_name_is_refused():
    with pytest.raises(RuntimeError, match="already registered as 'accalloc'"):
        accalloc.torch.register_host_device("other")
    assert accalloc.torch.register_host_device("accalloc") == "accalloc"


def test_a_torch_other_than_the_one_built_for_is_refused():
    code, out = run_python("""
        import torch
        torch.__version__ = "0.0.1"
        import accalloc.torch
        accalloc.torch.register_host_device()
    """)
    assert code != 0
    assert "accalloc.torch was built for torch" in out and "but this is torch 0.0.1" in out
    assert "pip install --no-build-isolation --force-reinstall ./python" in out


def test_use_for_cuda_without_a_gpu_says_why():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: tests/test_cuda.py covers use_for_cuda")
    code, out = run_python("import accalloc.torch; accalloc.torch.use_for_cuda()")
    assert code != 0
    assert "CUDA is not available in this process" in out or "built without CUDA support" in out, out


def test_the_cuda_extension_is_built_for_a_cuda_torch_and_binds_every_symbol():
    import ctypes
    import os
    from pathlib import Path

    import torch
    from accalloc.torch import _build_info

    if not torch.version.cuda:
        pytest.skip("this torch is not a CUDA build: use_for_cuda's extension is left out by design")
    assert _build_info.CUDA_EXTENSION, _build_info.LEFT_OUT
    extension = next(Path(accalloc.__file__).parent.glob("_torch_cuda*.so"))
    # RTLD_NOW: a CUDA name declared by accalloc (csrc/cuda_types) that libtorch_cuda does not export
    # under the same mangled name fails here, not on a user's GPU.
    ctypes.CDLL(str(extension), mode=os.RTLD_NOW | os.RTLD_GLOBAL)


def test_a_left_out_extension_says_why_when_its_feature_is_called():
    code, out = run_python("""
        import accalloc.torch
        from accalloc.torch import _build_info
        _build_info.CUDA_EXTENSION = False
        _build_info.LEFT_OUT = {"accalloc._torch_cuda": "building accalloc._torch_cuda failed: no compiler"}
        accalloc.torch.use_for_cuda()
    """)
    assert code != 0
    assert "built without CUDA support: building accalloc._torch_cuda failed: no compiler" in out, out


def test_the_version_and_abi_are_the_headers():
    import re
    from pathlib import Path

    header = (Path(accalloc.__file__).parent / "include" / "accalloc.h").read_text()
    version = ".".join(re.search(rf"^#define ACCALLOC_VERSION_{part} (\d+)$", header, flags=re.M).group(1)
                       for part in ("MAJOR", "MINOR", "PATCH"))
    assert accalloc.__version__ == version
    abi = int(re.search(r"^#define ACCALLOC_ABI_VERSION (\d+)$", header, flags=re.M).group(1))
    assert accalloc._library.ABI_VERSION == abi == accalloc._library.library().accalloc_abi_version()


def test_planner_stats_leave_out_what_an_older_library_did_not_fill(monkeypatch):
    # An older library (ACCALLOC_LIBRARY may name one) knows a shorter AccallocPlannerStats: it fills that
    # many bytes and says so in struct_size. What it did not fill is left out, not reported as zeros.
    known = accalloc._library.PlannerStats.from_parked.offset

    class OlderLibrary:
        def accalloc_planner_stats_on(self, device_type, index, out):
            stats = out._obj
            assert stats.struct_size == ctypes.sizeof(accalloc._library.PlannerStats)
            stats.struct_size, stats.enabled, stats.in_force, stats.plans = known, 1, 1, 2
            stats.from_parked = 99  # past what this library fills: never to be read
            return 0

        def accalloc_current_accelerator(self):
            return accalloc._library.DEVICE_HOST

    monkeypatch.setattr(accalloc, "library", OlderLibrary)
    stats = accalloc.planner_stats("host:0")
    assert stats["plans"] == 2 and stats["in_force"] is True
    assert "from_parked" not in stats and "plan_height" in stats, stats


def test_the_installed_package_declares_its_license():
    # What `pip show accalloc` says: the SPDX expression where the installing setuptools writes it
    # (77 on), the License field before.
    metadata = importlib.metadata.metadata("accalloc")
    assert (metadata.get("License-Expression") or metadata.get("License")) == "Apache-2.0"
