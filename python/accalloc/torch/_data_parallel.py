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
import warnings

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


def _contiguous_copy(tensor, device):
    # A copy of its own (no autograd history, its own version counter), laid out contiguously, as
    # CUDA's broadcasts allocate theirs.
    with torch.no_grad():
        return tensor.to(device, copy=True, memory_format=torch.contiguous_format)


def _copy_into(targets, sources, kind, what):
    for target, source in zip(targets, sources, strict=True):
        if target.device.type != kind:
            raise RuntimeError(f"{what}: Expected all output tensors to be {kind} tensors, but output "
                               f"tensor is on {target.device}")
        if target.shape != source.shape:
            raise RuntimeError(f"{what}: output tensor of shape {tuple(target.shape)} does not match "
                               f"the expected shape {tuple(source.shape)}")
        target.copy_(source)


def _broadcast(tensor, devices=None, *, out=None):
    devices = None if devices is None else list(devices)  # a generator is read once
    kind = _device_type([tensor] + list(out or []), devices)
    if kind is None:
        return _original["broadcast"](tensor, devices, out=out)
    if (devices is None) == (out is None):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}")
    tensor = comm._handle_complex(tensor)
    if out is not None:
        _copy_into(out, [tensor] * len(out), kind, "broadcast")
        return tuple(out)
    targets = [torch.device(kind, _get_device_index(d)) for d in devices]
    # The source device's entry is the tensor itself, as CUDA's hands it back.
    return tuple(tensor if tensor.device == target else _contiguous_copy(tensor, target) for target in targets)


def _broadcast_coalesced(tensors, devices, buffer_size=10485760):
    tensors, devices = list(tensors), list(devices)
    kind = _device_type(tensors, devices)
    if kind is None:
        return _original["broadcast_coalesced"](tensors, devices, buffer_size)
    targets = [torch.device(kind, _get_device_index(d)) for d in devices]
    if any(tensor.device != targets[0] for tensor in tensors):
        raise RuntimeError(f"All tensors must be on devices[0]: {targets[0].index}")
    tensors = [comm._handle_complex(tensor) for tensor in tensors]
    # The first device's entry is the tensors themselves, as CUDA's hands them back.
    return [list(tensors)] + [[_contiguous_copy(tensor, target) for tensor in tensors] for target in targets[1:]]


def _scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
    devices = None if devices is None else list(devices)
    kind = _device_type([tensor] + list(out or []), devices)
    if kind is None:
        return _original["scatter"](tensor, devices, chunk_sizes, dim, streams, out=out)
    tensor = comm._handle_complex(tensor)
    # The device has one stream per device and copies synchronously: the streams asked for change
    # nothing.
    if out is not None:
        if devices is not None:
            raise RuntimeError(
                f"'devices' must not be specified when 'out' is specified, but got devices={devices}")
        if chunk_sizes is not None:
            raise RuntimeError(
                f"'chunk_sizes' must not be specified when 'out' is specified, but got chunk_sizes={chunk_sizes}")
        sizes = [t.size(dim) if t.dim() == tensor.dim() else -1 for t in out]
        if any(size < 0 for size in sizes) or sum(sizes) != tensor.size(dim):
            raise RuntimeError(f"scatter: the output tensors' sizes along dimension {dim} ({sizes}) do not "
                               f"add up to the input's ({tensor.size(dim)})")
        _copy_into(out, tensor.split(sizes, dim), kind, "scatter")
        return tuple(out)
    indices = [_get_device_index(d) for d in devices]
    if chunk_sizes is None:
        chunks = tensor.chunk(len(indices), dim)
    else:
        chunk_sizes = list(chunk_sizes)
        if len(chunk_sizes) != len(indices):
            raise RuntimeError(
                f"Expected devices and chunk_sizes to be of same length, but got len(chunk_sizes) == "
                f"{len(chunk_sizes)} and len(devices) == {len(indices)}")
        chunks = tensor.split(chunk_sizes, dim)
    # A chunk already on its device stays the view it is, as on CUDA.
    return tuple(chunk.to(torch.device(kind, i)) for chunk, i in zip(chunks, indices))


def _gather(tensors, dim=0, destination=None, *, out=None):
    tensors = list(tensors)
    kind = _device_type(tensors + ([out] if out is not None else []))
    if kind is None or any(t.device.type != kind for t in tensors):
        # Tensors of several types (or none of the device's): PyTorch's function and its refusals.
        return _original["gather"](tensors, dim, destination, out=out)
    if not tensors:
        raise RuntimeError("gather: Expected at least one tensor to gather from")
    tensors = [comm._handle_complex(tensor) for tensor in tensors]
    first = tensors[0]
    dim = dim + first.dim() if dim < 0 else dim
    for i, tensor in enumerate(tensors):
        if tensor.dim() != first.dim() or any(
                a != b for d, (a, b) in enumerate(zip(tensor.shape, first.shape)) if d != dim):
            raise RuntimeError(f"gather: input tensor {i} has shape {tuple(tensor.shape)}, which does not "
                               f"match the first's {tuple(first.shape)} outside dimension {dim}")
    shape = list(first.shape)
    shape[dim] = sum(tensor.size(dim) for tensor in tensors)
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                f"'destination' must not be specified when 'out' is specified, but got destination={destination}")
        if list(out.shape) != shape:
            raise RuntimeError(f"gather: the output tensor's shape {tuple(out.shape)} is not the expected "
                               f"{tuple(shape)}")
        result = out
    else:
        if destination == -1:
            warnings.warn('Using -1 to represent CPU tensor is deprecated. Please use a device object or '
                          'string instead, e.g., "cpu".', FutureWarning, stacklevel=2)
        index = _get_device_index(destination, allow_cpu=True, optional=True) if destination is not None \
            else torch.accelerator.current_device_index()
        target = torch.device("cpu") if index == -1 else torch.device(kind, index)
        # The first tensor's dtype, as CUDA's; filled by copies, which autocast leaves alone (a cat
        # under the caller's autocast refused the replicas' half-precision outputs).
        result = torch.empty(shape, dtype=first.dtype, device=target)
    offset = 0
    for tensor in tensors:
        result.narrow(dim, offset, tensor.size(dim)).copy_(tensor)
        offset += tensor.size(dim)
    return result
