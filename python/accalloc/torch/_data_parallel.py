"""torch.nn.DataParallel over the accalloc device's indices (ACCALLOC_HOST_DEVICES=2 or more).

DataParallel scatters the batch, copies the module to each device, and gathers the outputs with
torch.nn.parallel.comm, whose copies (broadcast, broadcast_coalesced, scatter, gather) are CUDA's
own C++ functions: they take bare device indices and read them as CUDA devices ("Found no NVIDIA
driver"). serve(name) has them do, for tensors of the device type `name`, what they do on CUDA, with
the device's copies: the same results, the same tensors handed back where CUDA's hands back its
input (a broadcast's source device, a chunk already where it goes). Calls for other devices go to
PyTorch's own functions, unchanged. comm.reduce_add, which sums the replicas' gradients, is written
with plain tensor operations and needs nothing.

Which device type an index means: the type of the tensors given (or of `out`); for a CPU tensor
scattered or broadcast, the type of a torch.device given among the devices, else the current
accelerator's when it is the device (DataParallel scatters CPU batches so).
"""
import torch
from torch._utils import _get_device_index
from torch.nn.parallel import comm

_served = set()
_original = {}


def serve(name):
    """Have torch.nn.parallel.comm copy between devices of type `name` (idempotent)."""
    _served.add(name)
    if _original:
        return
    for function in (_broadcast, _broadcast_coalesced, _scatter, _gather):
        public = function.__name__[1:]
        _original[public] = getattr(comm, public)
        setattr(comm, public, function)


def _device_type(tensors, devices=()):
    """The served device type the call is about, or None (PyTorch's own function serves it)."""
    for tensor in tensors:
        if tensor.device.type in _served:
            return tensor.device.type
    for device in devices or ():
        if isinstance(device, (str, torch.device)) and torch.device(device).type in _served:
            return torch.device(device).type
    if all(tensor.device.type == "cpu" for tensor in tensors):
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is not None and accelerator.type in _served:
            return accelerator.type
    return None


def _unwrap_complex(tensor):
    # As comm does: complex tensors travel as their real views.
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def _broadcast(tensor, devices=None, *, out=None):
    kind = _device_type([tensor] + list(out or []), devices)
    if kind is None:
        return _original["broadcast"](tensor, devices, out=out)
    if (devices is None) == (out is None):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}")
    tensor = _unwrap_complex(tensor)
    if out is not None:
        for target in out:
            target.copy_(tensor)
        return tuple(out)
    indices = [_get_device_index(d) for d in devices]
    return tuple(tensor if tensor.device == torch.device(kind, i) else tensor.to(torch.device(kind, i), copy=True)
                 for i in indices)


def _broadcast_coalesced(tensors, devices, buffer_size=10485760):
    tensors = list(tensors)
    kind = _device_type(tensors, devices)
    if kind is None:
        return _original["broadcast_coalesced"](tensors, devices, buffer_size)
    indices = [_get_device_index(d) for d in devices]
    source = torch.device(kind, indices[0])
    if any(tensor.device != source for tensor in tensors):
        raise RuntimeError(f"broadcast_coalesced: all tensors must be on devices[0]: {indices[0]}")
    tensors = [_unwrap_complex(tensor) for tensor in tensors]
    # The first device's entry is the tensors themselves, as CUDA's hands them back.
    return [list(tensors)] + [[tensor.to(torch.device(kind, i), copy=True) for tensor in tensors]
                              for i in indices[1:]]


def _scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
    kind = _device_type([tensor] + list(out or []), devices)
    if kind is None:
        return _original["scatter"](tensor, devices, chunk_sizes, dim, streams, out=out)
    tensor = _unwrap_complex(tensor)
    # The device has one stream per device and copies synchronously: the streams asked for change
    # nothing.
    if out is not None:
        if devices is not None:
            raise RuntimeError(
                f"'devices' must not be specified when 'out' is specified, but got devices={devices}")
        if chunk_sizes is not None:
            raise RuntimeError(
                f"'chunk_sizes' must not be specified when 'out' is specified, but got chunk_sizes={chunk_sizes}")
        for target, chunk in zip(out, tensor.split([t.size(dim) for t in out], dim), strict=True):
            target.copy_(chunk)
        return tuple(out)
    indices = [_get_device_index(d) for d in devices]
    if chunk_sizes is None:
        chunks = tensor.chunk(len(indices), dim)
    else:
        if len(chunk_sizes) != len(indices):
            raise RuntimeError(
                f"Expected devices and chunk_sizes to be of same length, but got len(chunk_sizes) == "
                f"{len(chunk_sizes)} and len(devices) == {len(indices)}")
        chunks = tensor.split(list(chunk_sizes), dim)
    # A chunk already on its device stays the view it is, as on CUDA.
    return tuple(chunk.to(torch.device(kind, i)) for chunk, i in zip(chunks, indices))


def _gather(tensors, dim=0, destination=None, *, out=None):
    tensors = list(tensors)
    kind = _device_type(tensors + ([out] if out is not None else []))
    if kind is None:
        return _original["gather"](tensors, dim, destination, out=out)
    tensors = [_unwrap_complex(tensor) for tensor in tensors]
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                f"'destination' must not be specified when 'out' is specified, but got destination={destination}")
        return out.copy_(torch.cat([tensor.to(out.device) for tensor in tensors], dim))
    if destination == -1 or destination == "cpu" or (
            isinstance(destination, torch.device) and destination.type == "cpu"):
        target = torch.device("cpu")
    else:
        index = _get_device_index(destination, optional=True) if destination is not None else \
            torch.accelerator.current_device_index()
        target = torch.device(kind, index)
    return torch.cat([tensor.to(target) for tensor in tensors], dim)
