#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in under 8 minutes: build accalloc, run the CUDA tests, install the
# Python package and run its tests (use_for_cuda included), train a small model in PyTorch with accalloc
# as its CUDA allocator (accalloc.torch.use_for_cuda) and with PyTorch's own allocator (peak
# reserved and time per step), and replay the sample traces through accalloc and through PyTorch's own
# caching allocator, comparing all 122 statistics (they must match in the default configuration) and
# the time per operation; then time malloc/free of each trace through accalloc, PyTorch's caching
# allocator and cudaMallocAsync, as ratios. The output is saved to docs/gpu-results.md with the date
# and the device.
#
# Usage: scripts/gpu-check.sh            (needs cargo, python3 with torch built for CUDA, a GPU)
set -uo pipefail
cd "$(dirname "$0")/.."
out=docs/gpu-results.md
mkdir -p docs
log=$(mktemp)
exec > >(tee "$log") 2>&1

echo "# accalloc on a GPU"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo unknown)"
echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo
echo '```'
status=0

echo "== build"
timeout 240 cargo build --release || { echo "build failed"; exit 1; }
echo "== CUDA tests"
timeout 120 cargo test --release --test cuda -- --include-ignored --nocapture || status=1
./target/release/accalloc info

# The Python with torch: ACCALLOC_TORCH_VENV (as scripts/test-python.sh makes it) when there, else python3.
python=${ACCALLOC_TORCH_VENV:-$HOME/.cache/accalloc/torch-2.15}/bin/python
[ -x "$python" ] || python=python3
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "PyTorch with CUDA is not available: skipping the PyTorch comparisons"
else
  echo "== accalloc.torch: the package, use_for_cuda and its tests"
  "$python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python || status=1
  (cd python/tests && timeout 300 "$python" -m pytest -q -p no:cacheprovider -rs) || status=1
  echo "== training a small model: accalloc (accalloc.torch.use_for_cuda) vs PyTorch's allocator"
  for which in pytorch accalloc; do
    WHICH=$which timeout 120 "$python" - <<'PY' || status=1
import os, sys, time
which = os.environ["WHICH"]
import torch
if which == "accalloc":
    import accalloc, accalloc.torch
    accalloc.torch.use_for_cuda()
torch.manual_seed(0)
layers = []
for _ in range(8):
    layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(2048, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
times = []
for step in range(30):
    batch = 64 + 32 * (step % 5)  # varying batch sizes
    x = torch.randn(batch, 2048, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    torch.cuda.synchronize(); t = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    torch.cuda.synchronize(); times.append(time.perf_counter() - t)
step_ms = 1000 * sorted(times[5:])[len(times[5:]) // 2]
# With use_for_cuda, torch.cuda's figures are accalloc's: the same calls serve both.
peak = torch.cuda.max_memory_reserved(); allocated = torch.cuda.max_memory_allocated()
if which == "accalloc":
    assert torch.cuda.memory_stats() == accalloc.memory_stats("cuda:0")
print(f"{which:9s} peak reserved {peak/2**20:9.1f} MiB  peak allocated {allocated/2**20:9.1f} MiB  median step {step_ms:.2f} ms")
PY
  done

  echo "== replaying the sample traces: PyTorch's caching allocator vs accalloc (CUDA backend)"
  for trace in examples/traces/*.jsonl; do
    timeout 120 "$python" - "$trace" "$PWD/target/release/accalloc" <<'PY' || status=1
import json, subprocess, sys, time
import torch
trace, tool = sys.argv[1], sys.argv[2]
ops = [json.loads(line) for line in open(trace) if line.strip()]
torch.cuda.init()
torch.cuda.empty_cache(); torch.cuda.reset_accumulated_memory_stats(); torch.cuda.reset_peak_memory_stats()
streams = {0: torch.cuda.current_stream()}
live = {}
t = time.perf_counter()
for op in ops:
    if op["op"] == "alloc":
        if op["size"] == 0:
            continue
        stream = streams.setdefault(op.get("stream", 0), torch.cuda.Stream())
        try:
            live[op["id"]] = torch.cuda.caching_allocator_alloc(op["size"], stream=stream)
        except torch.cuda.OutOfMemoryError:
            pass
    elif op["op"] == "free":
        ptr = live.pop(op["id"], None)
        if ptr is not None:
            torch.cuda.caching_allocator_delete(ptr)
    else:
        torch.cuda.empty_cache()
torch_ns = (time.perf_counter() - t) * 1e9 / len(ops)
torch_stats = torch.cuda.memory_stats()
for ptr in live.values():
    torch.cuda.caching_allocator_delete(ptr)
acc = json.loads(subprocess.run([tool, "replay", trace, "--json", "--cuda"], capture_output=True, text=True, check=True).stdout)
ours = acc["stats"]
keys = sorted(k for k in ours if k in torch_stats)
diff = [k for k in keys if ours[k] != torch_stats[k]]
print(f"{trace}: {len(keys)} keys compared, {len(diff)} differ; ns/op pytorch {torch_ns:.0f}, accalloc {acc['ns_per_op']:.0f}")
for k in diff[:20]:
    print(f"   {k}: pytorch {torch_stats[k]} accalloc {ours[k]}")
PY
  done
fi
if "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  # The same trace through the same Python loop three ways, each in its own process: accalloc's C ABI
  # (ctypes), PyTorch's native caching allocator and PyTorch's cudaMallocAsync backend
  # (torch.cuda.caching_allocator_alloc/_delete). The loop's own cost, measured with a call that does
  # nothing, is subtracted; ratios below 1 mean accalloc is faster.
  echo "== timing malloc/free on the GPU: accalloc vs PyTorch's caching allocator vs cudaMallocAsync"
  echo "| trace | loop ns/op | accalloc ns/op | pytorch ns/op | cudaMallocAsync ns/op | accalloc / pytorch | accalloc / cudaMallocAsync |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for trace in examples/traces/*.jsonl; do
    declare -A ns=()
    for which in noop accalloc pytorch cudaMallocAsync; do
      conf=""
      [ "$which" = cudaMallocAsync ] && conf="backend:cudaMallocAsync"
      ns[$which]=$(env ${conf:+PYTORCH_CUDA_ALLOC_CONF=$conf} ACCALLOC_DEVICE=cuda WHICH=$which LIB="$lib" \
        timeout 150 "$python" - "$trace" <<'PY' || echo nan
import ctypes, json, os, sys, time
import torch
which, trace = os.environ["WHICH"], sys.argv[1]
ops = []
for line in open(trace):
    if line.strip():
        op = json.loads(line)
        if op["op"] == "alloc" and op["size"] > 0:
            ops.append((True, op["id"], op["size"], op.get("stream", 0)))
        elif op["op"] == "free":
            ops.append((False, op["id"], 0, 0))
torch.cuda.init()
torch_streams = {0: torch.cuda.current_stream()}
for _, _, _, s in ops:
    if s not in torch_streams:
        torch_streams[s] = torch.cuda.Stream()
if which == "accalloc":
    lib = ctypes.CDLL(os.environ["LIB"])
    lib.accalloc_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
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
else:
    streams = torch_streams
    def alloc(size, stream):
        return torch.cuda.caching_allocator_alloc(size, stream=stream)
    free = torch.cuda.caching_allocator_delete
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
PY
)
    done
    "$python" - "$trace" "${ns[noop]}" "${ns[accalloc]}" "${ns[pytorch]}" "${ns[cudaMallocAsync]}" <<'PY'
import sys
trace, loop, acc, pt, asy = sys.argv[1], *map(float, sys.argv[2:])
net = lambda x: max(x - loop, 1e-9)
print(f"| {trace.split('/')[-1]} | {loop:.0f} | {net(acc):.0f} | {net(pt):.0f} | {net(asy):.0f} | "
      f"{net(acc) / net(pt):.2f} | {net(acc) / net(asy):.2f} |")
PY
  done
fi
echo "== done (status $status)"
echo '```'
cp "$log" "$out"
echo "saved to $out"
exit $status
