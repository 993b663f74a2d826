"""Leaving the interpreter after a backward pass on the device, without PyTorch's abort at exit.

PyTorch 2.15 stashes a Python object (the caller's contextvars context) in the thread-local state of
every backward pass (torch/autograd/graph.py, _engine_run_backward), and the pass's graph task keeps a
copy. A device's part of a backward pass runs on PyTorch's autograd thread for that device, which can
drop the last reference to the graph task, and so to that object, a moment after backward() has
returned. Dropping it takes the GIL; when that moment falls in the interpreter's finalization, Python
ends the thread with pthread_exit, whose unwinding meets a noexcept frame, and the process aborts with
"terminate called without an active exception" (pytorch/pytorch#117762: about one exit in ten right
after a backward pass on a busy machine, here).

So at exit, before finalization, one more backward pass runs on each device, through the engine itself
(no object stashed): each device's autograd thread takes it after the program's last one, and has
dropped that one first, while the GIL can still be taken. This pass's own graph task holds no Python
object, so dropping it later needs no GIL.
"""
import torch
from torch.autograd.variable import Variable


def settle_autograd_threads(name):
    """Run a backward pass of one element on every device of `name` (an atexit handler)."""
    try:
        leaves = [torch.zeros((), device=f"{name}:{index}", requires_grad=True)
                  for index in range(torch.accelerator.device_count())]
        outputs = tuple(leaf * 1 for leaf in leaves)
        grads = tuple(torch.ones((), device=output.device) for output in outputs)
        Variable._execution_engine.run_backward(outputs, grads, False, False, (), True, True)
    except Exception:  # noqa: BLE001 - at exit there is no one to tell, and the exit goes on as before
        pass
