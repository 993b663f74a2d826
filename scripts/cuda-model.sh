#!/usr/bin/env bash
# Builds the strict model of the CUDA driver (cuda_model/) and prints the folder holding its
# libcuda.so.1 (and libcuda.so, the first name cudarc tries). With LD_LIBRARY_PATH set to that
# folder, accalloc's CUDA backend runs on the model's devices:
#   LD_LIBRARY_PATH=$(scripts/cuda-model.sh) ACCALLOC_DEVICE=cuda target/release/accalloc info
# Knobs (read at cuInit): ACCALLOC_CUDA_MODEL_DEVICES, ACCALLOC_CUDA_MODEL_CAPACITY,
# ACCALLOC_CUDA_MODEL_FAIL, ACCALLOC_CUDA_MODEL_ON_VIOLATION (cuda_model/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# Its own target folder, whatever CARGO_TARGET_DIR says: the library is looked for there.
cargo build --quiet --release --manifest-path cuda_model/Cargo.toml --target-dir cuda_model/target
out="$PWD/cuda_model/target/release/driver"
mkdir -p "$out"
cp -f cuda_model/target/release/libcuda.so "$out/libcuda.so.1"
ln -sf libcuda.so.1 "$out/libcuda.so"
echo "$out"
