"""The tests run inside real PyTorch, on the host accelerator accalloc.torch registers.

The environment is fixed before accalloc first loads (it reads it once): two host devices of 2 GiB
each, so that out-of-memory points are the same on every machine. Registration takes over
PrivateUse1 for the whole process, so it happens once, here; tests that need a process without it
start one (see run_python).
"""
import os
import subprocess
import sys
import textwrap

os.environ["ACCALLOC_HOST_DEVICES"] = "2"
os.environ["ACCALLOC_HOST_CAPACITY"] = "2GiB"
os.environ["ACCALLOC_DEVICE"] = "host"
for stale in ("ACCALLOC_CONF", "ACCALLOC_HOST_FAIL"):
    os.environ.pop(stale, None)

import pytest  # noqa: E402
import torch  # noqa: E402

import accalloc  # noqa: E402
import accalloc.torch  # noqa: E402

DEVICE = accalloc.torch.register_host_device("accalloc")
MiB = 1 << 20


def run_python(code, **env):
    """Run `code` in a fresh interpreter (with this environment plus `env`); (returncode, stdout+stderr)."""
    full_env = {**os.environ, **{k: str(v) for k, v in env.items()}}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def fresh_device():
    """Devices 0 and 1 with nothing live, nothing cached and every statistic at zero."""
    import gc

    gc.collect()
    for index in range(torch.accelerator.device_count()):
        assert torch.accelerator.memory_allocated(index) == 0, "a test before this one leaked a tensor"
    torch.accelerator.empty_cache()
    for index in range(torch.accelerator.device_count()):
        torch.accelerator.reset_accumulated_memory_stats(index)
        torch.accelerator.reset_peak_memory_stats(index)
    torch.accelerator.set_device_index(0)
    yield
    gc.collect()
