"""torch.distributed on the accalloc device: the process group backend "accalloc".

Gloo refuses tensors of any device but the CPU ("No backend type associated with device type
accalloc"), NCCL needs CUDA. The device's memory is host memory, so this backend runs gloo's
collectives over CPU tensors that view the device tensors' bytes (no copy): a collective writes the
device tensors in place, synchronously, and its work is complete when it returns, its future holding
the device tensors, as DistributedDataParallel's communication hooks expect. CPU tensors go to gloo as
they are. `dist.init_process_group("accalloc")` (or with no backend named, once the device is
registered: PyTorch takes a device's registered backend), then DDP on the device as on CUDA.
Imported only where torch.distributed and gloo are available (accalloc.torch.register_device).
"""
import ctypes
import datetime

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

BACKEND = "accalloc"


def _cpu_view(tensor):
    """A CPU tensor over `tensor`'s bytes (a device tensor's memory is host memory), or `tensor` itself
    when it is on the CPU already. Its strides and offset are the tensor's."""
    if tensor.device.type == "cpu":
        return tensor
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return torch.empty(tensor.shape, dtype=tensor.dtype)
    raw = (ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())
    flat = torch.frombuffer(raw, dtype=torch.uint8).view(tensor.dtype)
    return flat.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def _cpu_views_of(value):
    """`value` with each device tensor in it (in lists and tuples too) replaced by its CPU view."""
    if isinstance(value, torch.Tensor):
        return _cpu_view(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_views_of(v) for v in value)
    return value


def _done(result):
    """A completed work whose future holds `result` (the device tensors the collective wrote)."""
    future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _collective(name):
    """The process group's method `name`: gloo's, over the CPU views of its tensor arguments, waited
    for; the work's future holds the first argument (the collective's outputs: the tensors DDP's
    hooks read back), as on the device."""

    def method(self, *args, **kwargs):
        views = {key: _cpu_views_of(value) for key, value in kwargs.items()}
        getattr(self._gloo, name)(*[_cpu_views_of(a) for a in args], **views).wait()
        first = args[0] if args else []
        return _done(list(first) if isinstance(first, (list, tuple)) else [first] if isinstance(first, torch.Tensor)
                     else [])

    method.__name__ = name
    method.__doc__ = f"gloo's {name} over the tensors' bytes (see the module's docstring)."
    return method


# Every collective ProcessGroup has in torch 2.15 and gloo implements.
COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "allgather_coalesced",
    "all_gather_single", "all_gather_single_coalesced", "_allgather_base", "gather", "gather_single",
    "scatter", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "_reduce_scatter_base", "alltoall", "alltoall_base", "all_to_all_single", "send", "recv", "recv_anysource",
    "barrier", "monitored_barrier",
)


class AccallocProcessGroup(dist.ProcessGroup):
    """Gloo's collectives over the device tensors' bytes (see the module's docstring)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self):  # noqa: N802 - PyTorch's name
        return BACKEND

    # A ProcessGroup keeps its name and description on the backends registered in it, and a group
    # made in Python is its own backend, with none registered: PyTorch's setters had nowhere to put
    # them and `group_name` raised "ProcessGroup name not set", so every DeviceMesh (FSDP2's
    # fully_shard, DTensor) failed to start. The group keeps them itself.
    def _set_group_name(self, name):
        self._accalloc_group_name = name

    def _set_group_desc(self, desc):
        self._accalloc_group_desc = desc

    @property
    def group_name(self):
        name = getattr(self, "_accalloc_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    @property
    def group_desc(self):
        return getattr(self, "_accalloc_group_desc", "undefined")


for _name in COLLECTIVES:
    setattr(AccallocProcessGroup, _name, _collective(_name))


def _create(store, rank, size, timeout):
    return AccallocProcessGroup(store, rank, size, timeout if timeout is not None else datetime.timedelta(minutes=30))


def register(device_name):
    """Register the "accalloc" backend for the CPU and the device `device_name` (once)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", device_name])
