"""A vendor's path, end to end: an accelerator's raw functions registered with accalloc_register_backend
(here a toy driver over the C library's aligned malloc, written with ctypes), then made PyTorch's
PrivateUse1 device with accalloc.torch.register_device. Runs in its own process: PrivateUse1 is
taken by the host accelerator in this one."""
from conftest import run_python

TOY_BACKEND = r'''
import ctypes, gc, torch, accalloc, accalloc.torch
from accalloc._library import library, check

libc = ctypes.CDLL(None)
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
CAPACITY = 256 << 20
held = {0: 0, 1: 0}   # bytes the driver has handed out, per device
calls = {"alloc": 0, "free": 0}

i32, vp = ctypes.c_int32, ctypes.c_void_p
DEVICE_COUNT = ctypes.CFUNCTYPE(i32, vp, ctypes.POINTER(i32))
RAW_ALLOC = ctypes.CFUNCTYPE(i32, vp, i32, ctypes.c_size_t, vp, ctypes.POINTER(vp))
RAW_FREE = ctypes.CFUNCTYPE(i32, vp, i32, vp, ctypes.c_size_t)
MEM_GET_INFO = ctypes.CFUNCTYPE(i32, vp, i32, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64))

def device_count(context, out):
    out[0] = 2
    return 0

def raw_alloc(context, device, size, stream, out):
    if held[device] + size > CAPACITY:
        return 1  # ACCALLOC_BACKEND_OUT_OF_MEMORY
    ptr = ctypes.c_void_p()
    if libc.posix_memalign(ctypes.byref(ptr), 1 << 21, size) != 0:
        return 1
    held[device] += size
    calls["alloc"] += 1
    out[0] = ptr.value
    return 0

def raw_free(context, device, ptr, size):
    held[device] -= size
    calls["free"] += 1
    libc.free(ptr)
    return 0

def mem_get_info(context, device, free, total):
    free[0], total[0] = CAPACITY - held[device], CAPACITY
    return 0

class VTable(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("context", vp), ("device_count", DEVICE_COUNT),
                ("raw_alloc", RAW_ALLOC), ("raw_free", RAW_FREE), ("mem_get_info", MEM_GET_INFO)] + [
               (name, vp) for name in ("event_create", "event_record", "event_query", "event_synchronize",
                                       "event_destroy", "stream_synchronize", "vm_granularity", "vm_reserve",
                                       "vm_map", "vm_unmap", "vm_release")]

callbacks = (DEVICE_COUNT(device_count), RAW_ALLOC(raw_alloc), RAW_FREE(raw_free), MEM_GET_INFO(mem_get_info))
table = VTable(ctypes.sizeof(VTable), None, *callbacks)
lib = library()
lib.accalloc_register_backend.argtypes = [ctypes.c_char_p, ctypes.POINTER(VTable), ctypes.POINTER(i32)]
toy_type = i32()
check(lib.accalloc_register_backend(b"toy", ctypes.byref(table), ctypes.byref(toy_type)))

assert accalloc.torch.register_device("toy", toy_type.value) == "toy"
assert torch.accelerator.current_accelerator().type == "toy"
assert torch.accelerator.device_count() == 2

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
reference.load_state_dict(model.state_dict())
model = model.to("toy")
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
loss = torch.nn.functional.cross_entropy(model(x.to("toy")), y.to("toy"))
loss.backward()
expected = torch.nn.functional.cross_entropy(reference(x), y)
assert abs(loss.item() - expected.item()) < 1e-6, (loss.item(), expected.item())

stats = torch.accelerator.memory_stats()
assert stats == accalloc.memory_stats("toy:0"), "torch.accelerator reads accalloc's books"
assert stats["num_device_alloc"] == calls["alloc"] > 0, "every segment came from the toy driver"
assert stats["reserved_bytes.all.current"] == held[0]
assert torch.accelerator.get_memory_info() == (CAPACITY - held[0], CAPACITY)
on_one = torch.ones(1000, device="toy:1")
assert torch.accelerator.memory_allocated(1) == 4096 and held[1] == 2 << 20

try:
    torch.empty(300 << 20, dtype=torch.uint8, device="toy")
except torch.OutOfMemoryError as error:
    assert "toy out of memory" in str(error), str(error)
else:
    raise AssertionError("300 MiB fitted a 256 MiB device")

del model, reference, loss, x, y, on_one, stats
gc.collect()
torch.accelerator.empty_cache()
assert torch.accelerator.memory_allocated(0) == torch.accelerator.memory_reserved(0) == 0
assert held == {0: 0, 1: 0} and calls["alloc"] == calls["free"], (held, calls)
print("toy backend ok", calls)
'''


def test_a_backend_registered_from_c_becomes_pytorchs_device():
    code, out = run_python(TOY_BACKEND)
    assert code == 0 and "toy backend ok" in out, out
