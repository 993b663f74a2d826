"""accalloc inside PyTorch.

- register_host_device(name="accalloc"): an accelerator on DeviceType::PrivateUse1 whose memory is
  accalloc's host backend; torch.accelerator's whole API (memory included) then works on it.
- use_for_cuda(): accalloc becomes PyTorch's CUDA allocator, with torch.cuda.memory_stats() and
  torch.accelerator.memory_stats() reporting accalloc's figures.

- host_memory_stats(), reset_peak_host_memory_stats(), reset_accumulated_host_memory_stats(): the
  pinned host allocator behind pin_memory=True, non-blocking copies and
  torch.accelerator.empty_host_cache() on the accalloc device.

Both registrations are explicit: importing this module changes nothing in PyTorch. The C++ allocator both use,
accalloc_torch::DeviceAllocator, is in include/accalloc/torch_device_allocator.h (include_dir()), for a
vendor's PrivateUse1 backend to adopt.
"""
import atexit
import ctypes
import importlib
import sys
import threading
from pathlib import Path

import torch

import accalloc
from accalloc._library import DEVICE_HOST, library
from accalloc.torch import (_autograd_exit, _data_parallel, _device_module, _flex_attention, _inductor,
                           _module_conversion)
from accalloc.torch._pools import MemPool, PluggableAllocator, use_mem_pool  # noqa: F401 - the package's API
from accalloc.torch._sleep import forget, pause, paused_bytes, region, resume  # noqa: F401 - the package's API

_PACKAGE = Path(__file__).resolve().parent.parent
_lock = threading.Lock()
_host_name = None
_cuda_allocator = None


def include_dir():
    """The folder to add to a C++ backend's include path: accalloc.h and accalloc/torch_device_allocator.h."""
    return str(_PACKAGE / "include")


def _checked_build_info():
    try:
        info = importlib.import_module("accalloc.torch._build_info")
    except ImportError:
        raise ImportError("accalloc.torch's C++ extensions were not built: torch was not importable when the "
                          "package was installed. Reinstall it into this environment: python3 -m pip install "
                          "--no-build-isolation ./python") from None
    built_for, running = info.TORCH_VERSION, torch.__version__
    if built_for != running:
        raise ImportError(f"accalloc.torch was built for torch {built_for}, but this is torch {running}: "
                          "reinstall accalloc into this environment (python3 -m pip install --no-build-isolation "
                          "--force-reinstall ./python)")
    return info


def _extension(name):
    info = _checked_build_info()
    why = getattr(info, "LEFT_OUT", {}).get(f"accalloc.{name}")
    if why:
        raise RuntimeError(f"accalloc.torch's extension {name} was left out when accalloc was installed: {why}")
    library()  # libaccalloc first, globally: the extension links this same copy
    found = sorted(_PACKAGE.glob(f"{name}.*.so")) or sorted(_PACKAGE.glob(f"{name}.so"))
    if not found:
        raise ImportError(f"accalloc.torch's extension {name} is not installed in {_PACKAGE}")
    return ctypes.CDLL(str(found[0]), mode=ctypes.RTLD_GLOBAL)


def host_memory_stats():
    """The pinned host allocator's statistics of the accalloc accelerator, as torch.cuda.host_memory_stats()
    names them (allocations, allocated_bytes, active_requests, active_bytes, num_host_alloc, num_host_free,
    host_alloc_time, host_free_time; plus accalloc's page_locked_bytes), sorted by key."""
    # Before registration (_host_name None): accalloc's current accelerator.
    return accalloc.host_memory_stats(_host_name)


def reset_peak_host_memory_stats():
    """Set every peak of host_memory_stats() to its current value."""
    accalloc.reset_peak_host_memory_stats(_host_name)


def reset_accumulated_host_memory_stats():
    """Zero the running totals of host_memory_stats() (.allocated, .freed, num_host_*, the timings)."""
    accalloc.reset_accumulated_host_memory_stats(_host_name)


def _device_index(device):
    # torch.cuda's rules: an int as it is, None as -1, a device (or its string) by its index.
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return -1 if index is None else index


def register_host_device(name="accalloc"):
    """Make accalloc's host backend PyTorch's PrivateUse1 accelerator, named `name`; returns the name.

    Once per process (a second call with the same name returns it; another name is an error). From
    then on torch.accelerator.current_accelerator().type == name, tensors go to f"{name}:0" (one device
    per ACCALLOC_HOST_DEVICES), and every torch.accelerator memory figure is accalloc's.
    """
    return register_device(name, DEVICE_HOST)


def register_device(name, accalloc_device_type):
    """Make an accalloc device type PyTorch's PrivateUse1 accelerator, named `name`; returns the name.

    `accalloc_device_type` is ACCALLOC_DEVICE_HOST or a type accalloc_register_backend returned for a
    backend written in C whose memory the CPU can address (operators run on the CPU, over that memory).

    module.to(device) keeps tied weights tied and lazy ones lazy (see _module_conversion: PyTorch would
    give each module its own copy on a PrivateUse1 device); nothing else PyTorch does changes for code
    that does not use the device.
    """
    global _host_name
    with _lock:
        if _host_name is not None:
            if name != _host_name:
                raise RuntimeError(f"the accalloc accelerator is already registered as {_host_name!r}")
            return _host_name
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", name):
            raise RuntimeError(f"PyTorch's PrivateUse1 device is already {current!r}: one per process")
        extension = _extension("_torch_host")
        extension.accalloc_torch_register_device.argtypes = [ctypes.c_int32]
        result = extension.accalloc_torch_register_device(accalloc_device_type)
        if result == -2:
            raise RuntimeError("another accalloc device type is already PyTorch's PrivateUse1 device")
        if result != 0:
            count = ctypes.c_int32()
            accalloc._library.check(library().accalloc_device_count_on(accalloc_device_type, ctypes.byref(count)))
            raise RuntimeError(f"accalloc device type {accalloc_device_type} has no device")
        if current != name:
            torch.utils.rename_privateuse1_backend(name)
        # torch.accelerator.Graph: PyTorch finds a graph by the device type's name, so once named.
        extension.accalloc_torch_register_graphs()
        torch._register_device_module(name, _device_module.device_module(name, accalloc_device_type, extension))
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                              for_storage=True)
        accalloc._DEVICE_TYPES[name] = accalloc_device_type
        sys.modules[f"torch.{name}"] = getattr(torch, name)
        _module_conversion.keep_parameters_on(name)
        _inductor.serve(name)
        _flex_attention.serve(name)
        _data_parallel.serve(name)
        # torch.distributed: the "accalloc" backend, gloo over the device's memory (_distributed.py; a
        # torch built without distributed or gloo has nothing to register it with).
        if torch.distributed.is_available() and torch.distributed.is_gloo_available():
            from accalloc.torch import _distributed
            _distributed.register(name)
        # Autocast casts as on the CPU (csrc/host_autocast.cpp), to the CPU's default dtype too.
        torch.set_autocast_dtype(name, torch.bfloat16)
        # The device is ready from the start (there is nothing to initialize): a 0-byte tensor, which
        # takes no memory, has PyTorch run _lazy_init and count the device as initialized, so that
        # empty_host_cache() works before the first tensor is made on the device.
        torch.empty(0, device=name)
        # A backward pass on the device must not abort the process at exit (_autograd_exit).
        atexit.register(_autograd_exit.settle_autograd_threads, name)
        _host_name = name
        return name


def use_for_cuda():
    """Make accalloc PyTorch's CUDA allocator, keeping PyTorch's statistics; call before CUDA allocates.

    torch.cuda.memory_stats(), max_memory_allocated(), reset_peak_memory_stats(), memory_summary() and
    torch.accelerator.memory_stats() then report accalloc's figures.
    """
    global _cuda_allocator
    with _lock:
        if _cuda_allocator is not None:
            return
        info = _checked_build_info()
        if not info.CUDA_EXTENSION:
            why = getattr(info, "LEFT_OUT", {}).get("accalloc._torch_cuda", "it was not built")
            raise RuntimeError(f"accalloc.torch was built without CUDA support: {why}")
        if not torch.cuda.is_available():
            raise RuntimeError("use_for_cuda: CUDA is not available in this process (no GPU or no driver)")
        extension = _extension("_torch_cuda")
        extension.accalloc_torch_use_for_cuda.restype = ctypes.c_int
        extension.accalloc_torch_use_for_cuda_error.restype = ctypes.c_char_p
        if extension.accalloc_torch_use_for_cuda() != 0:
            raise RuntimeError(f"use_for_cuda: {extension.accalloc_torch_use_for_cuda_error().decode()}")
        _cuda_allocator = extension
