"""torch.compile's default backend, Inductor, on the host accelerator.

The device's memory is host memory, so Inductor's CPU code generation serves it: the C++ kernels it
writes take the device tensors' data pointers as they would a CPU tensor's. serve(name) registers, for
the device type `name`, Dynamo's CPU device interface, Inductor's CPU scheduling (CppScheduling), a
Python wrapper that calls those
kernels as it calls the CPU's (Inductor's own wrapper calls them only for "cpu" and "mps"), and the
CPU's device op overrides; makes the scheduler count the device's nodes as CPU nodes, so its
fusion choices are the CPU's (it takes the GPU's choices for any other device, and some of those
assume GPU kernels); and has Inductor name the device's code generator the C++ one
(_widen_current_backend).

Nothing is imported before Inductor is: importing it costs seconds, and most programs never compile.
The registration runs once torch._inductor.compile_fx, Inductor's entry point (torch.compile imports
it before compiling anything), has been imported, or at once when it already is (_import_hooks).
"""
import sys

import torch

from accalloc.torch import _flex_attention
from accalloc.torch._import_hooks import when_imported

_served = set()

# In every compilation's cache key (torch.compiler.config.cache_key_tag): code Inductor cached for the
# device by an accalloc that generated it otherwise is not taken up. Changed whenever what the
# adaptation below makes Inductor write for the device changes.
_CACHE_TAG = "accalloc-inductor-2"


def serve(name):
    """Have Inductor compile for the device type `name` as for the CPU (now or when it loads)."""
    _served.add(name)
    when_imported("torch._inductor.compile_fx", _register)


def _register():
    from torch._dynamo.device_interface import CpuInterface, get_registered_device_interfaces
    from torch._dynamo.device_interface import register_interface_for_device
    from torch._inductor import scheduler
    from torch._inductor.codegen.common import (get_scheduling_for_device, register_backend_for_device,
                                                register_device_op_overrides)
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
    from torch._inductor.virtualized import V

    class OnTheDevicesIndex:
        """Inductor allocates a buffer of a device type it does not know with the type alone,
        relying on a device guard it writes only for GPUs: a graph on accalloc:1 put its buffers on
        the current device (accalloc:0). The device's buffers are allocated on their own index."""

        def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
            line = super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
            if device.type in _served and device.index is not None:
                line = line.replace(f"device='{device.type}'", f"device='{device.type}:{device.index}'")
            return line

    class SubgraphWrapperCodegen(OnTheDevicesIndex, SubgraphPythonWrapperCodegen):
        pass

    class WrapperCodegen(OnTheDevicesIndex, PythonWrapperCodegen):
        """Inductor's Python wrapper, calling the device's C++ kernels as the CPU's."""

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return SubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
            return WrapperCodegen()

        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
            device = device or V.graph.get_current_device_or_throw()
            if not triton and device.type in _served:
                self.writeline(self.wrap_kernel_call(kernel_name, call_args))
                return
            super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)

    class DeviceInterface(CpuInterface):
        """The CPU's answers, but for the device's indices: a tensor made in a compiled graph with
        device="accalloc" and no index goes to the current device (Inductor asks the Worker)."""

        class Worker(CpuInterface.Worker):
            @staticmethod
            def current_device():
                return torch.accelerator.current_device_index()

        @staticmethod
        def current_device():
            return torch.accelerator.current_device_index()

        @staticmethod
        def device_count():
            return torch.accelerator.device_count()

    registered = dict(get_registered_device_interfaces())
    class NoCppWrapper(CppWrapperCpu):
        """Inductor's C++ wrapper (torch._inductor.config.cpp_wrapper) writes device calls of its own
        that know no PrivateUse1 device: refused with words, not a C++ compile error."""

        @staticmethod
        def create(*args, **kwargs):
            raise NotImplementedError(
                f"torch.compile on the {sorted(_served)} device: Inductor's C++ wrapper "
                "(torch._inductor.config.cpp_wrapper=True) is not supported there; the default Python "
                "wrapper is (set cpp_wrapper=False)")

    for name in _served:
        if name not in registered:
            # Its queries (properties, streams) answered as the CPU's are: the generated code is
            # the CPU's.
            register_interface_for_device(name, DeviceInterface)
        if get_scheduling_for_device(name) is None:
            register_backend_for_device(name, CppScheduling, WrapperCodegen, NoCppWrapper)
            register_device_op_overrides(name, CpuDeviceOpOverrides())
    if not getattr(scheduler.BaseSchedulerNode.is_cpu, "_accalloc", False):
        def is_cpu(node):
            device = node.get_device()
            return device is not None and (device.type == "cpu" or device.type in _served)

        is_cpu._accalloc = True
        scheduler.BaseSchedulerNode.is_cpu = is_cpu
    _widen_current_backend()
    _flex_attention.lower_as_on_the_cpu()
    tag = torch.compiler.config.cache_key_tag
    if _CACHE_TAG not in tag.split("+"):
        torch.compiler.config.cache_key_tag = f"{tag}+{_CACHE_TAG}" if tag else _CACHE_TAG


def _widen_current_backend():
    """Inductor's get_current_backend names the code generator of a device type: the CPU's
    (config.cpu_backend), and for any type it does not know, CUDA's ("triton"). Its kernels' ops
    handler (codegen.common.CSEProxy) types each value by those rules, so the device's C++ kernels
    were typed as Triton's: an index a random number is drawn at had no dtype, and every random
    operation (dropout, rand_like, ...) failed to compile. The device's code generator is the C++ one
    (CppScheduling, above): it answers "cpp" for the device, in every Inductor module holding the
    function (each imported it by name)."""
    from torch._inductor import utils
    from torch._inductor.virtualized import V

    original = utils.get_current_backend
    if getattr(original, "_accalloc", False):
        return

    def get_current_backend(device_type=None):
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type in _served else original(device_type)

    get_current_backend._accalloc = True
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("torch._inductor") and \
                getattr(module, "get_current_backend", None) is original:
            module.get_current_backend = get_current_backend

