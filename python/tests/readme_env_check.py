"""Run by scripts/test-readme-python.sh inside an environment made only by the README's steps (torch,
numpy, ninja, then accalloc): what a PyTorch user tries in the first minutes. Exits non-zero, saying
what failed, on the first failure. Not a pytest module: that environment has no pytest.
"""
import ctypes
import importlib.metadata
import os
import sys
from pathlib import Path

import torch
from torch import nn

import accalloc
import accalloc.torch
from accalloc.torch import _build_info


def check(condition, what):
    if not condition:
        sys.exit(f"readme_env_check: FAILED: {what}")
    print(f"ok: {what}")


installed = {dist.metadata["Name"].lower() for dist in importlib.metadata.distributions()}
check("nvidia-cuda-crt" not in installed, "the environment has no CUDA crt headers package (as torch installs it)")
check(not [name for name in installed if name.startswith("pytest")], "the environment is the README's: no pytest")

if torch.version.cuda:
    check(_build_info.CUDA_EXTENSION, f"a CUDA build of torch ({torch.version.cuda}) gets use_for_cuda's extension: "
          f"{_build_info.LEFT_OUT}")
    accalloc._library.library()
    extension = next(Path(accalloc.__file__).parent.glob("_torch_cuda*.so"))
    # Every symbol bound now, against this torch's libtorch_cuda: the CUDA names accalloc declares
    # itself (csrc/cuda_types) must be the ones libtorch_cuda exports.
    ctypes.CDLL(str(extension), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    check(True, f"{extension.name} loads with every symbol bound")

name = accalloc.torch.register_host_device()
check(name == "accalloc" and torch.accelerator.current_accelerator().type == name, "the host accelerator registers")
x = torch.randn(64, 64, device=name)
check(torch.equal((x @ x).cpu(), x.cpu() @ x.cpu()), "a matmul on the device gives the CPU's result")
check(torch.accelerator.memory_allocated() == accalloc.memory_allocated(f"{name}:0") > 0,
      "torch.accelerator.memory_allocated is accalloc's")

for target in ("cpu", name):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(10)).to(target)
    out = model(torch.randn(2, 3, 32, 32, device=target))
    check(out.shape == (2, 10), f"a lazy module runs after .to({target!r})")
check(not torch.__future__.get_swap_module_params_on_conversion(), "registering leaves PyTorch's switches alone")
print("readme_env_check: all passed")
