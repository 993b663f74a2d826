"""module.to(device) onto or off an accalloc device keeps each parameter the object it was, tied ones
tied and lazy ones lazy, as a move between the CPU and CUDA does.

Why: PyTorch 2.15 moves a parameter in place (`param.data = moved`) only between "dense" backends
(CPU, CUDA, XPU, ...). For a PrivateUse1 device Module._apply makes a new Parameter per module
instead, which does three kinds of harm:
- an optimizer made before model.to(device) (accelerate's prepare(model, optimizer) is built on it)
  holds the old CPU parameters: its steps change nothing the model computes with, silently;
- a matrix shared by two modules (the embeddings and output layer of GPT-2, BERT, T5) becomes two,
  and their gradients no longer add up;
- a lazy module's UninitializedParameter becomes an ordinary empty Parameter, so the module thinks it
  is initialized and its first call fails on a 0-element weight.
PyTorch's own remedy, torch.__future__.set_swap_module_params_on_conversion(True), is a process-wide
switch that changes every conversion, the CPU's included, and breaks lazy modules everywhere (an
uninitialized parameter cannot be swapped). accalloc does not flip it. Instead the outermost
Module._apply of a conversion notes which object each parameter slot held; where that conversion,
onto or off an accalloc device, made new Parameters, it swaps each old Parameter's contents for the
new one's (torch.utils.swap_tensors: the object, its attributes and every slot holding it stay; its
gradient moves with it) and puts it back in its slots, and gives each lazy slot an
UninitializedParameter on the new device and dtype. A parameter that cannot be swapped (a subclass
of Parameter, or one something else holds a reference to the data of) keeps PyTorch's new object,
one for all the slots that shared the old. Hooks registered on a parameter's tensor before the move
(register_hook) stay with the old contents, as under PyTorch's swap switch (and as with the new
objects before). Conversions that touch no accalloc device are left exactly as PyTorch makes them.
"""
import functools
import threading

import torch
from torch.nn.parameter import UninitializedParameter

_device_types = set()
_lock = threading.Lock()
_conversion = threading.local()  # .depth: Module._apply calls under way on this thread


def keep_parameters_on(device_type):
    """From now on, conversions onto or off `device_type` keep each parameter the object it was, tied
    ones tied and lazy ones lazy (idempotent)."""
    with _lock:
        if not _device_types:
            torch.nn.Module._apply = _keeping_parameters(torch.nn.Module._apply)
        _device_types.add(device_type)


def _keeping_parameters(apply):
    @functools.wraps(apply)
    def _apply(module, fn, *args, **kwargs):
        if getattr(_conversion, "depth", 0):
            return apply(module, fn, *args, **kwargs)  # the outermost call mends the whole tree
        recurse = args[0] if args else kwargs.get("recurse", True)
        slots = _slots_by_parameter(module.modules() if recurse else [module])
        _conversion.depth = 1
        try:
            result = apply(module, fn, *args, **kwargs)
        finally:
            _conversion.depth = 0
        for old, owners in slots:
            _mend(old, owners)
        return result

    return _apply


def _slots_by_parameter(modules):
    """[(parameter, [(module, name), ...])]: each parameter of `modules`, with the slots holding it."""
    by_parameter = {}
    for owner in modules:
        for name, parameter in owner._parameters.items():
            if parameter is not None:
                by_parameter.setdefault(id(parameter), (parameter, []))[1].append((owner, name))
    return list(by_parameter.values())


def _mend(old, owners):
    new = [owner._parameters.get(name) for owner, name in owners]
    if any(parameter is None or parameter is old for parameter in new):
        return  # moved in place (or swapped): PyTorch kept the object, nothing came apart
    if not ({old.device.type} | {parameter.device.type for parameter in new}) & _device_types:
        return
    kept = new[0]
    if isinstance(old, UninitializedParameter):
        if not isinstance(kept, UninitializedParameter):
            kept = UninitializedParameter(requires_grad=old.requires_grad, device=kept.device, dtype=kept.dtype)
    elif type(old) is torch.nn.Parameter and type(kept) is torch.nn.Parameter and _swapped(old, kept):
        kept = old
    for owner, name in owners:
        owner._parameters[name] = kept


def _swapped(old, moved):
    """Give `old` the contents of `moved` (the Parameter the conversion made), keeping old's identity
    and attributes; whether it could (not when something else holds old's data)."""
    attributes = dict(old.__dict__)
    grad, moved.grad = moved.grad, None  # a gradient held makes the tensor unswappable
    old_grad, old.grad = old.grad, None
    try:
        torch.utils.swap_tensors(old, moved)
    except RuntimeError:
        moved.grad, old.grad = grad, old_grad
        return False
    old.__dict__.update(attributes)
    old.grad = grad
    return True
