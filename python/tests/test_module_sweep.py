"""PyTorch's ModuleInfo database (torch.testing._internal.common_modules.module_db: every torch.nn module
PyTorch tests, recurrent networks and transformers included) on the accalloc device against the CPU:
for each module, its first sample inputs, in training and in eval mode, the same parameters on both,
the same random seed: equal outputs, and equal gradients of the inputs and of every parameter after a
backward pass over the sum of the outputs. A sample on which the CPU raises must raise on the device
too (some samples are meant for other dtypes)."""
import copy
import types

import pytest
import torch
from torch.testing._internal.common_modules import module_db

SAMPLES = 4
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5, "equal_nan": True}


def module_name(info):
    variant = getattr(info, "variant_name", "")
    return info.module_cls.__name__ + (f".{variant}" if variant else "")


def moved(value, device):
    """`value` (tensors in lists, tuples and dicts) on `device`, detached, needing gradients as before."""
    if isinstance(value, torch.Tensor):
        out = value.detach().to(device)
        return out.requires_grad_() if value.requires_grad else out
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}
    return value


def moved_input(function_input, device):
    """A sample's forward input (args and kwargs) on `device`."""
    return types.SimpleNamespace(args=moved(function_input.args, device), kwargs=moved(function_input.kwargs, device))


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def built_on_both(info, constructor, forward, seed):
    """The module on the CPU and a copy of it (the same parameters) on the device. Lazy modules take
    their shapes from a first call on each side."""
    torch.manual_seed(seed)
    on_cpu = info.module_cls(*constructor.args, **constructor.kwargs)
    if any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in on_cpu.parameters()):
        on_device = info.module_cls(*constructor.args, **constructor.kwargs).to("accalloc")
        on_cpu(*forward.args, **forward.kwargs)
        on_device(*moved(forward.args, "accalloc"), **moved(forward.kwargs, "accalloc"))
        on_device.load_state_dict(on_cpu.state_dict())
        return on_cpu, on_device
    return on_cpu, copy.deepcopy(on_cpu).to("accalloc")


def run(module, forward, seed):
    torch.manual_seed(seed)
    return module(*forward.args, **forward.kwargs)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("info", module_db, ids=module_name)
def test_the_module_agrees_with_the_cpu(fresh_device, info):
    for training in (True, False):
        samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                          training=training)
        for k, sample in enumerate(samples[:SAMPLES]):
            if sample.forward_input is None:
                continue
            where = f"{module_name(info)}, sample {k}, training={training}"
            on_cpu, on_device = built_on_both(info, sample.constructor_input, sample.forward_input, k)
            on_cpu.train(training)
            on_device.train(training)
            cpu_input = moved_input(sample.forward_input, "cpu")
            device_input = moved_input(sample.forward_input, "accalloc")
            try:
                cpu_out = run(on_cpu, cpu_input, 1000 + k)
            except Exception:  # noqa: BLE001 - a sample for another dtype: the device must refuse it too
                with pytest.raises(Exception):  # noqa: B017, PT011
                    run(on_device, device_input, 1000 + k)
                continue
            device_out = run(on_device, device_input, 1000 + k)
            cpu_results, device_results = tensors_in(cpu_out), tensors_in(device_out)
            assert len(device_results) == len(cpu_results), where
            for c, d in zip(cpu_results, device_results):
                assert d.device.type == "accalloc", where
                torch.testing.assert_close(d.detach().cpu(), c.detach(), **TOLERANCE, msg=lambda m: f"{where}: {m}")
            differentiable = [(c, d) for c, d in zip(cpu_results, device_results) if c.requires_grad]
            if not differentiable:
                continue
            sum(c.sum() for c, _ in differentiable).backward()
            sum(d.sum() for _, d in differentiable).backward()
            cpu_leaves = [t for t in tensors_in(cpu_input.args) + tensors_in(cpu_input.kwargs) if t.requires_grad]
            device_leaves = [t for t in tensors_in(device_input.args) + tensors_in(device_input.kwargs)
                             if t.requires_grad]
            cpu_leaves += list(on_cpu.parameters())
            device_leaves += list(on_device.parameters())
            for c, d in zip(cpu_leaves, device_leaves):
                assert (c.grad is None) == (d.grad is None), where
                if c.grad is not None:
                    torch.testing.assert_close(d.grad.cpu(), c.grad, **TOLERANCE,
                                               msg=lambda m: f"{where}, gradients: {m}")
