#!/usr/bin/env bash
# On the GPU machine: build ggml's CUDA backend as a dynamically loaded library
# (GGML_BACKEND_DL) from .ggml-src, else .llama-src/ggml (see prepare.sh), and put libggml-cuda.so in
# DEST (default .gpu-carry, next to the binary, where `--device cuda` looks).
#
# Kept short: only the H200's architecture (sm_90 machine code, no PTX), CUDA
# graphs on (decode replays one graph per step shape), flash-attention kernels for
# F16 K/V only (GGML_CUDA_FA_ALL_QUANTS off), no NCCL, no CPU backend (the binary
# brings its own). The libggml-base built here is NOT used: the process already
# has the carried one (same source), and the backend shares it by soname. The source
# is patched first by pdl-ops.py (PDL limitable by op, off unless asked for) and
# stream-priority.py (a backend may ask for high-priority streams) and green-ctx.py (a
# backend may run on a share of the SMs).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.gpu-carry}
build=${GGML_CUDA_BUILD_DIR:-/tmp/ggml-cuda-build}
arch=${CUDA_ARCH:-90-real}
t0=$(date +%s)
src="$root/.ggml-src"
[ -d "$src" ] || src="$root/.llama-src/ggml"
# PDL limitable by op (see pdl-ops.py); without its env vars the library behaves as
# unpatched, so llama.cpp's tools run on it unchanged.
python3 "$root/scripts/gpu/pdl-ops.py" "$src"
# Streams at high priority for a backend started with "stream_priority=high" (the
# decode steps, so that an encoder's kernels on another stream do not hold them up).
python3 "$root/scripts/gpu/stream-priority.py" "$src"
# Streams on a share of the SMs (a green context) for a backend started with
# "sm_share=P" (the vision encoder beside the decode steps on one GPU).
python3 "$root/scripts/gpu/green-ctx.py" "$src"
cmake -S "$src" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON \
    -DGGML_NATIVE=OFF -DGGML_CPU=OFF -DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$build.configure.log"
cmake --build "$build" -j"$(nproc)" --target ggml-cuda
lib=$(find "$build" -name libggml-cuda.so -type f | head -1)
cp "$lib" "$dest/"
echo "built $dest/libggml-cuda.so ($(du -h "$lib" | cut -f1)) in $(( $(date +%s) - t0 )) s"
