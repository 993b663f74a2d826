"""Leaving the interpreter after a backward pass on the device, without PyTorch's abort at exit.

PyTorch 2.15 stashes a Python object (the caller's contextvars context) in the thread-local state of
every backward pass (torch/autograd/graph.py, _engine_run_backward), and the pass's graph task keeps a
copy. A device's part of a backward pass runs on PyTorch's autograd thread for that device, which can
drop the last reference to the graph task, and so to that object, a moment after backward() has
returned. Dropping it takes the GIL; when that moment falls in the interpreter's finalization, Python
ends the thread with pthread_exit, whose unwinding meets a noexcept frame, and the process aborts with
"terminate called without an active exception" (pytorch/pytorch#117762; one exit in three when the
program and its device thread share one CPU, a few in a hundred otherwise).

So at exit, before finalization, one more backward pass runs on each device, through the engine itself
(nothing stashed): each device's autograd thread takes it after the program's last one, and has
dropped that one first, while the GIL can still be taken. The pass's tensors have no elements, so it
allocates nothing: an ACCALLOC_TRACE recording and the statistics are as if it had not run.
"""
import torch
from torch.autograd.variable import Variable


def settle_autograd_threads(name):
    """Run a backward pass over no elements on every device of `name` (an atexit handler)."""
    try:
        count = getattr(torch, name).device_count()
        leaves = [torch.empty(0, device=f"{name}:{index}", requires_grad=True) for index in range(count)]
        # A view has a backward node on the leaf's device, which the device's thread runs.
        outputs = tuple(leaf.view(0) for leaf in leaves)
        grads = tuple(torch.empty(0, device=output.device) for output in outputs)
        Variable._execution_engine.run_backward(outputs, grads, False, False, (), True, True)
    except Exception:  # noqa: BLE001 - at exit there is no one to tell, and the exit goes on as before
        pass
