"""The Python package on accalloc's CUDA backend, over the strict model of the CUDA driver
(scripts/cuda-model.sh builds it; cuda_model/). accalloc.memory_stats("cuda:0") and its friends read the
CUDA backend's books. PyTorch's own CUDA runtime cannot run on the model (it needs the real driver's
entry points), so torch.cuda stays unavailable there and accalloc.torch.use_for_cuda is tested only on a
GPU (test_cuda.py, scripts/gpu-check.sh)."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir():
    folder = os.environ.get("ACCALLOC_CUDA_MODEL_DIR")
    if not folder:
        folder = subprocess.run([str(ROOT / "scripts" / "cuda-model.sh")], check=True, capture_output=True,
                                text=True).stdout.strip()
    assert (pathlib.Path(folder) / "libcuda.so.1").exists(), folder
    return folder


def on_model(model_dir, code):
    """Run `code` in a fresh interpreter whose libcuda is the model (two 4 GiB devices), with accalloc's
    default accelerator left to detection: (returncode, output)."""
    env = {k: v for k, v in os.environ.items() if k != "ACCALLOC_DEVICE"}
    env.update(LD_LIBRARY_PATH=model_dir, ACCALLOC_CUDA_MODEL_DEVICES="2", ACCALLOC_CUDA_MODEL_CAPACITY="4G")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_the_memory_api_reads_the_cuda_backends_books(model_dir):
    code, out = on_model(model_dir, """
        import ctypes, accalloc
        from accalloc._library import library
        lib = library()
        MiB = 1 << 20
        assert accalloc.current_accelerator() == "cuda", accalloc.current_accelerator()
        assert accalloc.device_count("cuda") == 2
        free, total = accalloc.get_memory_info("cuda:1")
        assert (free, total) == (4 << 30, 4 << 30), (free, total)
        malloc = lib.accalloc_malloc_on
        malloc.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int32,
                           ctypes.c_void_p]
        a, b = ctypes.c_void_p(), ctypes.c_void_p()
        assert malloc(1, ctypes.byref(a), 3 * MiB, 1, None) == 0
        assert malloc(1, ctypes.byref(b), 1000, 1, None) == 0
        s = accalloc.memory_stats("cuda:1")
        assert s["allocated_bytes.all.current"] == 3 * MiB + 1024, s["allocated_bytes.all.current"]
        assert s["reserved_bytes.large_pool.current"] == 20 * MiB
        assert s["segment.all.current"] == 2
        assert accalloc.memory_allocated("cuda:1") == 3 * MiB + 1024
        assert accalloc.memory_stats("cuda:0")["allocated_bytes.all.current"] == 0
        assert accalloc.get_memory_info("cuda:1")[0] == (4 << 30) - 22 * MiB, "the model's driver counts it"
        assert "| Allocations" in accalloc.memory_summary("cuda:1")
        lib.accalloc_free.argtypes = [ctypes.c_void_p]
        assert lib.accalloc_free(a) == 0 and lib.accalloc_free(b) == 0
        assert accalloc.max_memory_allocated("cuda:1") == 3 * MiB + 1024
        accalloc.reset_peak_memory_stats("cuda:1")
        assert accalloc.max_memory_allocated("cuda:1") == 0
        accalloc.empty_cache("cuda:1")
        assert accalloc.memory_reserved("cuda:1") == 0
        assert accalloc.get_memory_info("cuda:1") == (4 << 30, 4 << 30), "every segment went back"
        print("ok")
    """)
    assert code == 0 and out.strip().endswith("ok"), out


def test_pytorchs_cuda_runtime_does_not_run_on_the_model(model_dir):
    code, out = on_model(model_dir, """
        import warnings, torch, accalloc
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert not torch.cuda.is_available(), "PyTorch's CUDA runtime needs the real driver"
        assert accalloc.current_accelerator() == "cuda"
        print("ok")
    """)
    assert code == 0 and out.strip().endswith("ok"), out
