#!/usr/bin/env bash
# On the GPU machine: build llama.cpp's llama-bench, as the reference for Tempo9's
# GPU numbers, from .llama-src (the SAME llama.cpp source as the ggml the binary
# links; staged by prepare.sh) and run it with the CUDA backend Tempo9 uses
# (.gpu-carry/libggml-cuda.so, built by build-cuda.sh or unpacked from .gpu-cache:
# same source and flags). Only a benchmark reference: Tempo9 never calls llama_*.
#
# The build compiles no CUDA: ggml-base, the loader, a CPU backend module, libllama,
# llama-common and llama-bench (~2 min on 16 cores); with GGML_BACKEND_DL the
# CUDA library is loaded from the binary's directory at run time.
#
# Also llama-batched-bench and llama-mtmd-cli when prepare.sh staged their source.
# Usage: scripts/gpu/llama-bench.sh build | run MODEL [llama-bench args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${LLAMA_BUILD_DIR:-/tmp/llama-build}
case ${1:-} in
build)
    t0=$(date +%s)
    cmake -S "$root/.llama-src" -B "$build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON \
        -DGGML_CUDA=OFF -DGGML_CPU=ON -DGGML_NATIVE=OFF \
        -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON \
        >"$build.configure.log"
    targets=(llama-bench ggml-cpu)
    [ -d "$root/.llama-src/tools/batched-bench" ] && targets+=(llama-batched-bench)
    [ -d "$root/.llama-src/tools/mtmd" ] && targets+=(llama-mtmd-cli)
    cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
    cp "$root/.gpu-carry/libggml-cuda.so" "$build/bin/"
    echo "built $build/bin/llama-bench in $(( $(date +%s) - t0 )) s"
    ;;
run)
    shift
    model=$1
    shift
    LD_LIBRARY_PATH="$build/bin" "$build/bin/llama-bench" -m "$model" "$@"
    ;;
*)
    echo "usage: $0 build | run MODEL [args]" >&2
    exit 2
    ;;
esac
