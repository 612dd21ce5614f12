#!/usr/bin/env bash
# Without a GPU machine: applies build-cuda.sh's patches (pdl-ops.py, stream-priority.py)
# to a copy of the crate's ggml-cuda source and type-checks the host side of ggml-cuda.cu
# (where both patches' host code lives, with common.cuh) with clang's CUDA front end, so a
# broken patch shows here rather than in a device call. Device code is not compiled.
#
# clang 14 takes CUDA <= 11.x headers: they come from NVIDIA's pip wheels (CUDA 11.8)
# into ~/.cache/tempo9/cuda11 (network on first use), laid out as a CUDA installation in
# ~/.cache/tempo9/cuda-fake11. libstdc++ 12 uses __attribute__((__noinline__)), which
# CUDA 11.8's host_defines.h breaks by defining __noinline__, so that define is dropped
# there (ggml-cuda.cu does not use it).
# Usage: scripts/gpu/check-patches.sh
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cache=$HOME/.cache/tempo9
cuda=$cache/cuda-fake11
if [ ! -f "$cuda/include/cuda.h" ]; then
    python3 -m venv "$cache/cuda11"
    "$cache/cuda11/bin/pip" install -q "nvidia-cuda-runtime-cu11==11.8.*" "nvidia-cuda-nvcc-cu11==11.8.*" \
        nvidia-curand-cu11 nvidia-cublas-cu11
    sp=$(echo "$cache"/cuda11/lib/python3*/site-packages/nvidia)
    mkdir -p "$cuda/include" "$cuda/bin" "$cuda/nvvm/libdevice" "$cuda/lib64"
    for d in "$sp"/*/include; do cp -rn "$d"/* "$cuda/include/"; done
    cp "$sp"/cuda_nvcc/nvvm/libdevice/* "$cuda/nvvm/libdevice/"
    cp "$sp"/cuda_nvcc/bin/ptxas "$cuda/bin/"
    printf '#!/bin/sh\necho nvcc\n' >"$cuda/bin/nvcc" && chmod +x "$cuda/bin/nvcc"
    echo "CUDA Version 11.8.0" >"$cuda/version.txt"
    sed -i 's/^#define __noinline__ \\$/#define __tempo9_dropped_noinline__ \\/; s/^#define __noinline__ .*$/\/* dropped by check-patches.sh *\//' \
        "$cuda/include/crt/host_defines.h"
fi
version=$(grep -A1 '^name = "llama-cpp-sys-2"' "$root/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')
ggml=$(ls -d "$HOME"/.cargo/registry/src/*/llama-cpp-sys-2-"$version"/llama.cpp/ggml | head -1)
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
mkdir -p "$src/src"
cp -a "$ggml/include" "$src/"
cp "$ggml"/src/*.h "$src/src/"
cp -a "$ggml/src/ggml-cuda" "$src/src/"
python3 "$root/scripts/gpu/pdl-ops.py" "$src"
python3 "$root/scripts/gpu/stream-priority.py" "$src"
cd "$src/src/ggml-cuda"
clang++ -x cuda --cuda-host-only -fsyntax-only --cuda-path="$cuda" --no-cuda-version-check \
    --cuda-gpu-arch=sm_86 -std=c++17 -I"$src/include" -I"$src/src" -I. \
    -DGGML_CUDA_USE_GRAPHS -DGGML_USE_CUDA -Wno-unknown-cuda-version ggml-cuda.cu
echo "patched ggml-cuda.cu: host side type-checks"
