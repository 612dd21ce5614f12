#!/usr/bin/env bash
# Without a GPU machine: applies build-cuda.sh's patches (pdl-ops.py, stream-priority.py, green-ctx.py)
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
python3 "$root/scripts/gpu/green-ctx.py" "$src"
cd "$src/src/ggml-cuda"
clang++ -x cuda --cuda-host-only -fsyntax-only --cuda-path="$cuda" --no-cuda-version-check \
    --cuda-gpu-arch=sm_86 -std=c++17 -I"$src/include" -I"$src/src" -I. \
    -DGGML_CUDA_USE_GRAPHS -DGGML_USE_CUDA -Wno-unknown-cuda-version ggml-cuda.cu
echo "patched ggml-cuda.cu: host side type-checks"
# green-ctx.py's code needs CUDA >= 12.5 (skipped above under 11.8): its host code
# type-checks with g++ against CUDA 13's driver header (pip wheel, network on first
# use), pulled out of the patched files with stand-ins for the ggml types it touches.
cu13=$cache/cuda13
if [ ! -f "$cu13/include/cuda.h" ]; then
    d=$(mktemp -d)
    pip download -q --no-deps -d "$d" "nvidia-cuda-runtime==13.0.*"
    python3 -m zipfile -e "$d"/*.whl "$d/x"
    mkdir -p "$cu13" && cp -r "$d"/x/nvidia/cu13/include "$cu13/"
    rm -rf "$d"
fi
python3 - "$src/src/ggml-cuda" >"$src/green.cpp" <<'PY'
import sys
d = sys.argv[1]
main = open(d + "/ggml-cuda.cu").read()
a = main.index('    // Tempo9 patch (scripts/gpu/green-ctx.py): "sm_share=P"')
init = main[a:main.index("#endif\n    return backend;", a)]
common = open(d + "/common.cuh").read()
a = common.index("            if (tempo9_green_ctx != nullptr")
make = common[a:common.index("            } else\n#endif", a)] + "            }\n"
print("""#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#define GGML_LOG_INFO(...) printf(__VA_ARGS__)
#define GGML_LOG_WARN(...) printf(__VA_ARGS__)
#define CU_CHECK(x) (void) (x)
typedef CUstream cudaStream_t;
struct ggml_backend_cuda_context {
    int device = 0;
    int tempo9_stream_priority = 0;
    CUgreenCtx tempo9_green_ctx = nullptr;
    cudaStream_t streams[1][1] = {};
    void make(int device, int stream) {
""" + make + """    }
};
struct backend_t { void * context; };
struct device_ctx { int device; };
static void ggml_cuda_set_device(int) {}
void init(backend_t * backend, device_ctx * ctx, const char * params) {
""" + init + "}")
PY
g++ -std=c++17 -fsyntax-only -I"$cu13/include" "$src/green.cpp"
echo "green-ctx.py: host code type-checks against CUDA 13's driver API"
