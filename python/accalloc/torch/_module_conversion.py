"""module.to(device) onto or off an accalloc device keeps tied parameters tied and lazy ones lazy.

Why: PyTorch 2.15 moves a parameter in place (`param.data = moved`) only between "dense" backends
(CPU, CUDA, XPU, ...). For a PrivateUse1 device Module._apply makes a new Parameter per module
instead, which does two kinds of harm:
- a matrix shared by two modules (the embeddings and output layer of GPT-2, BERT, T5) becomes two,
  and their gradients no longer add up;
- a lazy module's UninitializedParameter becomes an ordinary empty Parameter, so the module thinks it
  is initialized and its first call fails on a 0-element weight.
PyTorch's own remedy, torch.__future__.set_swap_module_params_on_conversion(True), is a process-wide
switch that changes every conversion, the CPU's included, and breaks lazy modules everywhere (an
uninitialized parameter cannot be swapped). accalloc does not flip it. Instead the outermost
Module._apply of a conversion notes which parameter slots shared one object and which held an
uninitialized parameter; where that conversion, onto or off an accalloc device, made new Parameters,
it points every tied slot at one of them and gives each lazy slot an UninitializedParameter on the
new device and dtype. Conversions that touch no accalloc device are left exactly as PyTorch makes
them.
"""
import functools
import threading

import torch
from torch.nn.parameter import UninitializedParameter

_device_types = set()
_lock = threading.Lock()
_conversion = threading.local()  # .depth: Module._apply calls under way on this thread


def keep_parameters_on(device_type):
    """From now on, conversions onto or off `device_type` keep tied parameters tied and lazy ones lazy
    (idempotent)."""
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
    """[(parameter, [(module, name), ...])] for each parameter held in more than one slot, or lazy."""
    by_parameter = {}
    for owner in modules:
        for name, parameter in owner._parameters.items():
            if parameter is not None:
                by_parameter.setdefault(id(parameter), (parameter, []))[1].append((owner, name))
    return [(parameter, owners) for parameter, owners in by_parameter.values()
            if len(owners) > 1 or isinstance(parameter, UninitializedParameter)]


def _mend(old, owners):
    new = [owner._parameters.get(name) for owner, name in owners]
    if any(parameter is None or parameter is old for parameter in new):
        return  # moved in place (or swapped): PyTorch kept the object, nothing came apart
    if not ({old.device.type} | {parameter.device.type for parameter in new}) & _device_types:
        return
    kept = new[0]
    if isinstance(old, UninitializedParameter) and not isinstance(kept, UninitializedParameter):
        kept = UninitializedParameter(requires_grad=old.requires_grad, device=kept.device, dtype=kept.dtype)
    for owner, name in owners:
        owner._parameters[name] = kept
