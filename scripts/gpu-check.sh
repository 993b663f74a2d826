#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in under 8 minutes: build accalloc, run the CUDA tests, install the
# Python package and run its tests (use_for_cuda included), train a small model in PyTorch with accalloc
# as its CUDA allocator (accalloc.torch.use_for_cuda) and with PyTorch's own allocator (peak
# reserved and time per step), try CUDA graphs, MemPool and torch.compile(mode="reduce-overhead") through
# it, and replay the sample traces through accalloc and through PyTorch's own
# caching allocator, comparing all 122 statistics (they must match in the default configuration) and
# the time per operation; replay the real fixed-shape traces with planned placement on the GPU (the
# same peaks and device calls as on the simulated device); then time malloc/free of each trace through accalloc, PyTorch's caching
# allocator and cudaMallocAsync, as ratios. The output is saved to docs/gpu-results.md with the date
# and the device (replacing the last run's; docs/GPU.md keeps, by hand, what each run found).
#
# Usage: scripts/gpu-check.sh            (needs cargo, python3 with torch built for CUDA, a GPU)
#        ACCALLOC_GPU_PREBUILT=DIR scripts/gpu-check.sh
#            on a GPU machine with no Rust toolchain or registry: DIR holds what scripts/gpu/prebuild.sh
#            built elsewhere (libaccalloc.so, the accalloc tool, the CUDA test binaries), used as built
#        ACCALLOC_GPU_PYTESTS="test_cuda.py ..."   the Python test files to run (default: all of them)
# The Python of each step is in scripts/gpu/.
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
if [ -n "${ACCALLOC_GPU_PREBUILT:-}" ]; then
  echo "- commit: $(cat "$ACCALLOC_GPU_PREBUILT/commit" 2>/dev/null || echo unknown) (prebuilt)"
else
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
echo
echo '```'
status=0

prebuilt=${ACCALLOC_GPU_PREBUILT:-}
if [ -n "$prebuilt" ]; then
  prebuilt=$(cd "$prebuilt" && pwd) || { echo "ACCALLOC_GPU_PREBUILT: no folder $ACCALLOC_GPU_PREBUILT"; exit 1; }
  lib=$prebuilt/libaccalloc.so
  tool=$prebuilt/accalloc
  echo "== CUDA tests"
  timeout 120 "$prebuilt/cuda-tests" --include-ignored --nocapture || status=1
  timeout 60 "$prebuilt/cuda-capture-tests" --include-ignored --nocapture || status=1
else
  echo "== build"
  timeout 240 cargo build --release || { echo "build failed"; exit 1; }
  lib=$PWD/target/release/libaccalloc.so
  tool=$PWD/target/release/accalloc
  echo "== CUDA tests"
  timeout 180 cargo test --release --test cuda --test cuda_capture -- --include-ignored --nocapture || status=1
fi
"$tool" info

# The Python with torch: ACCALLOC_TORCH_VENV (as scripts/test-python.sh makes it) when there, else python3.
. scripts/lib/env.sh
python=$ACCALLOC_TORCH_VENV/bin/python
[ -x "$python" ] || python=python3
echo "== planned placement on the GPU: the real fixed-shape traces, the same figures as on the simulated device"
echo "| trace | utilization | device calls | GPU ns/op | simulated ns/op | same peaks and calls |"
echo "|---|---:|---:|---:|---:|---|"
for trace in examples/traces/real/*_fixed.jsonl; do
  timeout 120 python3 scripts/gpu/planned_row.py "$trace" "$tool" || status=1
done

if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "PyTorch with CUDA is not available: skipping the PyTorch comparisons"
else
  echo "== accalloc.torch: the package, use_for_cuda and its tests"
  ACCALLOC_LIB_DIR=$(dirname "$lib") "$python" -m pip install --quiet --no-build-isolation --no-deps \
    --force-reinstall ./python || status=1
  # shellcheck disable=SC2086 # a list of file names
  (cd python/tests && timeout 300 "$python" -m pytest -q -p no:cacheprovider -rs ${ACCALLOC_GPU_PYTESTS:-}) || status=1
  echo "== training a small model: accalloc (accalloc.torch.use_for_cuda) vs PyTorch's allocator"
  for which in pytorch accalloc; do
    timeout 120 "$python" scripts/gpu/train_small_model.py "$which" || status=1
  done

  echo "== CUDA graphs and torch.cuda.MemPool through use_for_cuda"
  timeout 120 "$python" scripts/gpu/graph_capture.py || status=1
  echo "== torch.compile(mode=\"reduce-overhead\") (CUDA graph trees) through use_for_cuda"
  echo "== Triton's compile with and without accalloc (scripts/gpu/triton_probe.py)"
  timeout 300 "$python" scripts/gpu/triton_probe.py || status=1
  for which in pytorch accalloc; do  # Inductor's and Triton's warnings kept out, shown on a failure
    if ! timeout 240 "$python" scripts/gpu/compile_reduce_overhead.py "$which" 2>"$log.stderr"; then
      status=1
      tail -n 5 "$log.stderr" | cut -c1-300
    fi
  done
  rm -f "$log.stderr"

  echo "== replaying the sample traces: PyTorch's caching allocator vs accalloc (CUDA backend)"
  for trace in examples/traces/*.jsonl; do
    timeout 120 "$python" scripts/gpu/replay_stats.py "$trace" "$tool" || status=1
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
      ns[$which]=$(env ${conf:+PYTORCH_CUDA_ALLOC_CONF=$conf} ACCALLOC_DEVICE=cuda \
        timeout 150 "$python" scripts/gpu/time_malloc_free.py "$trace" "$which" "$lib" || echo nan)
    done
    "$python" scripts/gpu/ratio_row.py "$trace" "${ns[noop]}" "${ns[accalloc]}" "${ns[pytorch]}" "${ns[cudaMallocAsync]}"
  done
fi
echo "== done (status $status)"
echo '```'
cp "$log" "$out"
echo "saved to $out"
exit $status
