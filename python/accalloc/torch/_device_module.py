"""torch.<name> for the accalloc accelerator: the module torch._register_device_module takes, with the
names torch.cuda has for what CUDA-minded code asks of a device (torch.<name>.current_stream(),
mem_get_info(), get_device_properties(i).total_memory, manual_seed_all(), MemPool, ...), each over
torch.accelerator or accalloc's C ABI."""
import contextlib
import ctypes
import operator
import types
import warnings

import torch

import accalloc
from accalloc._library import library
from accalloc.torch import _memory_history
from accalloc.torch._pools import MemPool, use_mem_pool


def device_module(name, accalloc_device_type, extension):
    """The Python module torch._register_device_module needs for the accelerator `name`."""
    from accalloc import torch as accalloc_torch  # the package's own functions (it imports this file)

    module = types.ModuleType("accalloc.torch.device")
    lib = library()
    device_index = accalloc_torch._device_index

    def device_count():
        count = ctypes.c_int32()
        accalloc._library.check(lib.accalloc_device_count_on(accalloc_device_type, ctypes.byref(count)))
        return count.value

    def current_device():
        index = ctypes.c_int32()
        accalloc._library.check(lib.accalloc_current_device_on(accalloc_device_type, ctypes.byref(index)))
        return index.value

    def set_device(device):
        index = device if isinstance(device, int) else torch.device(device).index
        accalloc._library.check(lib.accalloc_set_device_on(accalloc_device_type, index))

    class device:
        """Context manager that makes `device` (an index, "name:i" or a torch.device; None or -1:
        nothing) this thread's current device, and restores the previous one on exit, as
        torch.cuda.device does (torch.load and storage.to use it)."""

        def __init__(self, device):
            self.index = device_index(device)
            self.previous = -1

        def __enter__(self):
            self.previous = current_device()
            if self.index >= 0 and self.index != self.previous:
                set_device(self.index)

        def __exit__(self, *exception):
            if self.index >= 0 and self.index != self.previous:
                set_device(self.previous)
            return False

    module.device = device
    module.is_available = lambda: device_count() > 0
    module.is_initialized = lambda: True
    # PyTorch marks a PrivateUse1 device initialized only through its module's _lazy_init, and until
    # then treats it as never used: torch.accelerator.empty_host_cache() would do nothing.
    module._lazy_init = lambda: None
    module.init = module._lazy_init
    module._is_in_bad_fork = lambda: False
    module.device_count = device_count
    module.current_device = current_device
    module.set_device = set_device
    module.synchronize = lambda device=None: None  # host memory: every operation has completed
    module.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    # The CPU computes bfloat16 (the device's kernels are the CPU's).
    module.is_bf16_supported = lambda including_emulation=True: True
    _add_random_numbers(module, device_count)
    _add_memory(module, name)

    # torch.cuda's names for streams, events and the device's figures, over torch.accelerator's.
    def torch_device(device=None):
        """`device` (an index, "name:i" or a torch.device; None or -1: the current one) as a device of
        this accelerator; a device of another type, or an index below -1, is refused, as torch.cuda's
        functions refuse them."""
        if device is not None and not isinstance(device, int) and torch.device(device).type != name:
            raise ValueError(f"Expected a {name} device, but got: {torch.device(device)}")
        index = device_index(device)
        if index < -1:
            raise ValueError(f"Expected a {name} device index of -1 (the current device) or more, but got: {index}")
        return torch.device(name, current_device() if index < 0 else index)

    # "accalloc host" for the host accelerator: accalloc and the backend's name.
    device_name = f"accalloc {lib.accalloc_device_type_name(accalloc_device_type).decode()}"

    def get_device_properties(device=None):
        """The device's name, type, index and total_memory (bytes), as attributes (a device that does
        not exist is an error)."""
        device = torch_device(device)
        total = accalloc.get_memory_info(device)[1]
        return types.SimpleNamespace(name=device_name, type=name, index=device.index, total_memory=total)

    def get_device_name(device=None):
        """The device's name (a device that does not exist is an error)."""
        return get_device_properties(device).name

    module.current_stream = lambda device=None: torch.accelerator.current_stream(torch_device(device))
    # Every stream of an accalloc device is its default one (csrc/host_device.cpp).
    module.default_stream = module.current_stream
    module.set_stream = torch.accelerator.set_stream
    module.stream = lambda stream: contextlib.nullcontext() if stream is None else stream
    module.Stream = lambda device=None, priority=0: torch.Stream(device=torch_device(device), priority=priority)
    module.Event = lambda enable_timing=False, blocking=False, interprocess=False: torch.Event(
        device=torch_device(), enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
    module.mem_get_info = lambda device=None: accalloc.get_memory_info(torch_device(device))
    module.set_per_process_memory_fraction = lambda fraction, device=None: (
        accalloc.set_per_process_memory_fraction(fraction, torch_device(device)))
    module.get_per_process_memory_fraction = lambda device=None: (
        accalloc.get_per_process_memory_fraction(torch_device(device)))

    def caching_allocator_alloc(size, device=None, stream=None):
        """`size` bytes from the device's cache as an address (0 for 0 bytes), counted in its figures
        as a tensor's memory is, as torch.cuda.caching_allocator_alloc hands them out; give them back
        with caching_allocator_delete. Every stream of the device is its default one, so `stream` (a
        stream or None) changes nothing."""
        size = operator.index(size)  # a whole number (a float is a TypeError)
        if size < 0:
            raise ValueError(f"caching_allocator_alloc takes a size of 0 bytes or more, not {size}")
        out = ctypes.c_void_p()
        index = torch_device(device).index
        accalloc._library.check(lib.accalloc_malloc_on(accalloc_device_type, ctypes.byref(out), size, index, None))
        return out.value or 0

    def caching_allocator_delete(mem_ptr):
        """Give back an address caching_allocator_alloc handed out (0: nothing). An address accalloc
        never handed out, or one already given back, is an error that changes nothing; the address of a
        live tensor's memory frees it under the tensor, as torch.cuda's does: undefined."""
        accalloc._library.check(lib.accalloc_free(mem_ptr))

    module.caching_allocator_alloc = caching_allocator_alloc
    module.caching_allocator_delete = caching_allocator_delete
    module.memory_snapshot = lambda: accalloc.memory_snapshot(name)["segments"]
    module.get_device_name = get_device_name
    module.get_device_properties = get_device_properties
    # torch.cuda's names for the pinned host allocator's figures (torch.<name>.host_memory_stats()).
    module.host_memory_stats = accalloc_torch.host_memory_stats
    module.host_memory_stats_as_nested_dict = lambda: _nested(accalloc_torch.host_memory_stats())
    module.reset_peak_host_memory_stats = accalloc_torch.reset_peak_host_memory_stats
    module.reset_accumulated_host_memory_stats = accalloc_torch.reset_accumulated_host_memory_stats
    # Private pools as torch.cuda names them (torch.<name>.MemPool, use_mem_pool).
    module.MemPool = MemPool
    module.use_mem_pool = use_mem_pool
    # torch.<name>.memory, as torch.cuda.memory: the functions above and the memory history.
    module.memory = _memory_history.memory_module(module, name, extension)
    return module


def _add_random_numbers(module, device_count):
    """torch.cuda's names for the device's random numbers. The device's kernels are the CPU's and draw
    from the CPU's default generator (csrc/host_device.cpp), so that the device gives the CPU's numbers
    for a seed: seeding the device seeds that generator, and its state is that generator's."""

    def manual_seed(seed):
        """Seed the generator the device draws from (the CPU's default one)."""
        torch.default_generator.manual_seed(int(seed))

    def seed():
        """Seed the generator the device draws from with a random number."""
        torch.default_generator.seed()

    module.manual_seed = manual_seed
    module.manual_seed_all = manual_seed
    module.seed = seed
    module.seed_all = seed
    module.initial_seed = torch.initial_seed
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.get_rng_state_all = lambda: [torch.get_rng_state() for _ in range(device_count())]

    def set_rng_state_all(new_states):
        for state in new_states:
            torch.set_rng_state(state)

    module.set_rng_state_all = set_rng_state_all


def _add_memory(module, name):
    """torch.cuda's names for the device's memory figures, over torch.accelerator's (accalloc's), with
    torch.cuda's deprecated ones, which warn as they do there."""
    for function in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                     "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                     "memory_summary", "get_memory_info"):
        setattr(module, function, getattr(torch.accelerator, function, getattr(accalloc, function)))
    module.empty_cache = torch.accelerator.empty_cache
    module.memory_stats_as_nested_dict = lambda device=None: _nested(module.memory_stats(device))

    def renamed(old, new):
        def call(device=None):
            warnings.warn(f"torch.{name}.{old} is deprecated (as in torch.cuda): use torch.{name}.{new}",
                          FutureWarning, stacklevel=2)
            return getattr(module, new)(device)
        call.__name__ = old
        call.__doc__ = f"torch.{name}.{new}, under torch.cuda's deprecated name."
        return call

    for old, new in (("memory_cached", "memory_reserved"), ("max_memory_cached", "max_memory_reserved"),
                     ("reset_max_memory_allocated", "reset_peak_memory_stats"),
                     ("reset_max_memory_cached", "reset_peak_memory_stats")):
        setattr(module, old, renamed(old, new))


def _nested(flat):
    """A dict of "a.b.c" keys as the nested dict torch.cuda.memory_stats_as_nested_dict() returns."""
    nested = {}
    for key, value in flat.items():
        *outer, last = key.split(".")
        place = nested
        for part in outer:
            place = place.setdefault(part, {})
        place[last] = value
    return nested
