"""FlexAttention (torch.nn.attention.flex_attention) on the accalloc device.

PyTorch lets flex_attention run on a fixed list of device types and refuses the rest by name.
On the device it runs as follows:
- eagerly, forward and backward, through PyTorch's reference implementation of the operator
  (plain tensor operations, the same on every device): the CPU's results; the CPU itself refuses a
  backward pass, CUDA does not, and neither does the device, so a model that trains with
  FlexAttention on a GPU trains here;
- under torch.compile, for inference: Inductor's C++ FlexAttention kernel, the CPU's (the device's
  memory is host memory; _inductor.py serves the device as the CPU). Inductor has no host kernel
  for the backward pass, the log-sum-exp or the max scores. Where a call needs one of them (query,
  key or value need a gradient; return_lse or return_aux asks; Hugging Face asks for the log-sum-exp
  on every device but the CPU), the checks below refuse while Dynamo traces, and Dynamo runs the
  function calling flex_attention eagerly (torch.compile(fullgraph=True) passes the refusal on,
  with its words). A graph that needs the backward pass another way (a learnt tensor in score_mod)
  is refused with the same words when Inductor lowers it.

serve(name) adapts PyTorch's checks when torch.nn.attention.flex_attention is imported (it costs a
fifth of a second; most programs never import it); lower_as_on_the_cpu runs when Inductor loads.
"""
import operator

import torch

from accalloc.torch._import_hooks import when_imported

_served = set()

_COMPILED_INFERENCE_ONLY = (
    "torch.compile of flex_attention on the {device} device compiles inference only, as on the CPU: "
    "Inductor's host kernel has neither a backward pass nor the log-sum-exp or max scores. Call "
    "flex_attention outside the compiled region (torch.compiler.disable) to train with it or to "
    "have those returned: eagerly it runs forward and backward on the device.")


def serve(name):
    """Let flex_attention run on the device type `name` (now, or when it is imported)."""
    _served.add(name)
    when_imported("torch.nn.attention.flex_attention", _adapt_checks)


def _on_device(*tensors):
    return next((t.device.type for t in tensors if t.device.type in _served), None)


def _adapt_checks():
    from torch.nn.attention import flex_attention as flex

    if getattr(flex._validate_device, "_accalloc", False):
        return
    validate_device = flex._validate_device
    apply_kernel_options = flex._apply_kernel_options

    def _validate_device(query, key, value):
        device = _on_device(query, key, value)
        if device is None:
            return validate_device(query, key, value)
        if torch.compiler.is_compiling() and torch.is_grad_enabled() and \
                any(t.requires_grad for t in (query, key, value)):
            raise NotImplementedError(_COMPILED_INFERENCE_ONLY.format(device=device))
        return None

    def _apply_kernel_options(query, key, value, return_lse, kernel_options, return_aux=None):
        device = _on_device(query, key, value)
        compiling = device is not None and torch.compiler.is_compiling()
        if compiling and (return_lse or (return_aux is not None and (return_aux.lse or return_aux.max_scores))):
            raise NotImplementedError(_COMPILED_INFERENCE_ONLY.format(device=device))
        options = apply_kernel_options(query, key, value, return_lse, kernel_options, return_aux)
        # The log-sum-exp is written for a backward pass that may come; compiled on the device
        # (inference only, above) none does, and Inductor's host kernel cannot write it. Eagerly the
        # reference implementation computes it whatever this says.
        if compiling:
            options["OUTPUT_LOGSUMEXP"] = False
        return options

    _validate_device._accalloc = True
    flex._validate_device = _validate_device
    flex._apply_kernel_options = _apply_kernel_options


def lower_as_on_the_cpu():
    """Inductor's lowering of flex_attention takes the device's graphs to the CPU's C++ kernel (it
    would take them to its Triton kernel, for GPUs), and refuses the backward pass for them."""
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu
    from torch._inductor.lowering import lowerings
    from torch._inductor.virtualized import V

    forward_op = torch.ops.higher_order.flex_attention
    backward_op = torch.ops.higher_order.flex_attention_backward
    forward = lowerings.get(forward_op)
    backward = lowerings.get(backward_op)
    if forward is None or getattr(forward, "_accalloc", False):
        return

    # Both lowerings take (query, key, value, ...) and the forward's kernel options come seventh,
    # as lower_cpu takes them.
    def argument(args, kwargs, position, name):
        return args[position] if len(args) > position else kwargs[name]

    def lower_forward(*args, **kwargs):
        device = argument(args, kwargs, 0, "query").get_device().type
        if device not in _served:
            return forward(*args, **kwargs)
        options = argument(args, kwargs, 6, "kernel_options")
        # lower_cpu gives the output alone: a graph reading the log-sum-exp (for a backward pass)
        # or the max scores would index past it.
        node = getattr(V.graph, "current_node", None)
        reads_more = node is not None and any(
            user.target is operator.getitem and user.args[1] != 0 for user in node.users)
        if reads_more or options.get("OUTPUT_LOGSUMEXP") or options.get("OUTPUT_MAX"):
            raise NotImplementedError(_COMPILED_INFERENCE_ONLY.format(device=device))
        return lower_cpu(*args, **kwargs)

    def lower_backward(*args, **kwargs):
        device = argument(args, kwargs, 0, "query").get_device().type
        if device in _served:
            raise NotImplementedError(_COMPILED_INFERENCE_ONLY.format(device=device))
        return backward(*args, **kwargs)

    lower_forward._accalloc = True
    lowerings[forward_op] = lower_forward
    if backward is not None:
        lowerings[backward_op] = lower_backward
