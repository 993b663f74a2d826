"""Time one trace's malloc/free on the GPU through one allocator, in the same Python loop for each, and
print the best of three runs in ns per operation. Part of scripts/gpu-check.sh, which runs it once per
allocator, each in its own process:

    python scripts/gpu/time_malloc_free.py TRACE noop|accalloc|pytorch|cudaMallocAsync [LIBACCALLOC]

  noop             a call that does nothing: the loop's own cost, which gpu-check.sh subtracts
  accalloc         accalloc's C ABI through ctypes (LIBACCALLOC, the path of libaccalloc.so; run with
                   ACCALLOC_DEVICE=cuda)
  pytorch          torch.cuda.caching_allocator_alloc/_delete: PyTorch's native caching allocator
  cudaMallocAsync  the same calls on PyTorch's cudaMallocAsync backend (run with
                   PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, which PyTorch reads at start)
"""
import ctypes
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for trace_format
import trace_format  # noqa: E402

trace, which = sys.argv[1], sys.argv[2]
ops = []
for op in trace_format.iter_trace(trace):
    if op.op == "alloc" and op.size > 0:
        ops.append((True, op.id, op.size, op.stream))
    elif op.op == "free":
        ops.append((False, op.id, 0, 0))
torch.cuda.init()
torch_streams = {0: torch.cuda.current_stream()}
for _, _, _, s in ops:
    if s not in torch_streams:
        torch_streams[s] = torch.cuda.Stream()
if which == "accalloc":
    lib = ctypes.CDLL(sys.argv[3])
    lib.accalloc_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int,
                                    ctypes.c_void_p]
    lib.accalloc_free.argtypes = [ctypes.c_void_p]
    streams = {s: (None if s == 0 else ctypes.c_void_p(st.cuda_stream)) for s, st in torch_streams.items()}
    out = ctypes.c_void_p()

    def alloc(size, stream):
        if lib.accalloc_malloc(ctypes.byref(out), size, -1, stream) != 0:
            raise MemoryError
        return out.value

    free = lib.accalloc_free
elif which == "noop":
    streams = torch_streams

    def alloc(size, stream):
        return size

    def free(ptr):
        return None
elif which in ("pytorch", "cudaMallocAsync"):
    backend = torch.cuda.get_allocator_backend()
    if backend != ("native" if which == "pytorch" else "cudaMallocAsync"):
        sys.exit(f"{which}: PyTorch's allocator backend is {backend} (PYTORCH_CUDA_ALLOC_CONF)")
    streams = torch_streams

    def alloc(size, stream):
        return torch.cuda.caching_allocator_alloc(size, stream=stream)

    free = torch.cuda.caching_allocator_delete
else:
    sys.exit(f"usage: {sys.argv[0]} TRACE noop|accalloc|pytorch|cudaMallocAsync [LIBACCALLOC] (got {which!r})")
best = float("inf")
for _ in range(3):
    live = {}
    torch.cuda.synchronize()
    t = time.perf_counter()
    for is_alloc, ident, size, s in ops:
        if is_alloc:
            try:
                live[ident] = alloc(size, streams[s])
            except (MemoryError, torch.cuda.OutOfMemoryError):
                pass
        else:
            ptr = live.pop(ident, None)
            if ptr is not None:
                free(ptr)
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter() - t) * 1e9 / len(ops))
    for ptr in live.values():
        free(ptr)
print(f"{best:.1f}")
