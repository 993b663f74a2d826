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
uninitialized parameter cannot be swapped). accalloc does not flip it. Instead, as soon as each
module's Module._apply has converted its own parameters (before an override such as RNNBase's takes
weak references to them, and before the next module is converted, so that the old copies go as the
move goes rather than all at its end), where that conversion, onto or off an accalloc device, made a
new Parameter, the old Parameter takes the new one's contents (torch.utils.swap_tensors: the object,
its attributes and the gradient stay with it) and goes back in its slot; a slot still holding a
parameter mended earlier in the same conversion (a tied one) gets what that one became; a lazy slot
gets an UninitializedParameter on the new device and dtype. A parameter that cannot be swapped (a
subclass of Parameter; one held by a weak reference, as torch.compile's guards hold them; one whose
tensor something else shares) keeps PyTorch's new object, with a warning that names it, since an
optimizer made before the move still holds the old one. What swap_tensors cannot carry over: hooks
registered on the parameter's tensor before the move (register_hook,
register_post_accumulate_grad_hook) stay with the old contents, and a backward pass through a graph
recorded before the move raises, as under PyTorch's swap switch (a move between the CPU and CUDA
keeps the hooks). Conversions that touch no accalloc device are left exactly as PyTorch makes them.
"""
import functools
import threading
import warnings

import torch
from torch.nn.parameter import UninitializedParameter

_device_types = set()
_lock = threading.Lock()
# .kept: during a conversion on this thread, {id(old parameter): (old, what its slots hold now)}
# (the old object is held so that its id is not reused); .unswapped: the slots that got PyTorch's new
# object. None outside a conversion.
_conversion = threading.local()


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
        outermost = getattr(_conversion, "kept", None) is None
        if outermost:
            _conversion.kept, _conversion.unswapped = {}, []
        try:
            own = [(name, parameter) for name, parameter in module._parameters.items() if parameter is not None]
            result = apply(module, fn, *args, **kwargs)
            for name, old in own:
                _mend(module, name, old)
            unswapped = _conversion.unswapped
        finally:
            if outermost:
                _conversion.kept = _conversion.unswapped = None
        if outermost and unswapped:
            shown = ", ".join(unswapped[:5]) + (f" and {len(unswapped) - 5} more" if len(unswapped) > 5 else "")
            warnings.warn(f"module.to(): {shown} could not keep its Parameter object across the move (a weak "
                          "reference to it, or its tensor shared), and is a new one: an optimizer made before "
                          "the move still holds the old one; make it after the move", stacklevel=3)
        return result

    return _apply


def _mend(module, name, old):
    """Slot `name` of `module` held `old` before its conversion: keep that object where PyTorch made a
    new one, onto or off an accalloc device."""
    new = module._parameters.get(name)
    if new is None or new is old:
        return  # moved in place (or swapped): PyTorch kept the object
    if not {old.device.type, new.device.type} & _device_types:
        return
    earlier = _conversion.kept.get(id(old))
    if earlier is not None:
        module._parameters[name] = earlier[1]  # tied to a slot mended before in this conversion
        return
    kept = new
    if isinstance(old, UninitializedParameter):
        if not isinstance(new, UninitializedParameter):
            kept = UninitializedParameter(requires_grad=old.requires_grad, device=new.device, dtype=new.dtype)
    elif type(old) is torch.nn.Parameter and type(new) is torch.nn.Parameter and _swapped(old, new):
        kept = old
    else:
        _conversion.unswapped.append(f"{type(module).__name__}.{name}")
    module._parameters[name] = kept
    _conversion.kept[id(old)] = (old, kept)


def _swapped(old, moved):
    """Give `old` the contents of `moved` (the Parameter the conversion made), keeping old's identity,
    attributes and a gradient moved with it; whether it could. A failed swap_tensors may have swapped
    the two objects' attributes before it failed: each gets its own back."""
    old_attributes, moved_attributes = old.__dict__, moved.__dict__
    grad, moved.grad = moved.grad, None  # a gradient held makes the tensor unswappable
    old_grad, old.grad = old.grad, None
    try:
        torch.utils.swap_tensors(old, moved)
        swapped = True
    except RuntimeError:
        swapped = False
    old.__dict__, moved.__dict__ = old_attributes, moved_attributes
    if swapped:
        old.grad = grad
    else:
        moved.grad, old.grad = grad, old_grad
    return swapped
