#!/usr/bin/env bash
# On the build machine (here): stage what the GPU machine needs, in folders git
# ignores, so `run` can carry them:
#   .ggml-src/  ggml's source from the SAME llama-cpp-sys-2 crate the binary links
#               (only the CUDA and CPU folders kept; ~9 MB), built there by build-cuda.sh;
#   .gpu-carry/ the stripped tempo9 binary and the ggml shared libraries it loads
#               (libggml-base, libggml, libggml-cpu) from the cargo target dir.
# Usage: scripts/gpu/prepare.sh [TARGET_RELEASE_DIR]
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
version=$(grep -A1 '^name = "llama-cpp-sys-2"' "$root/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')
src=$(ls -d "$HOME"/.cargo/registry/src/*/llama-cpp-sys-2-"$version"/llama.cpp/ggml | head -1)
bin=${1:-${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}/release}

rm -rf "$root/.ggml-src"
mkdir -p "$root/.ggml-src/src"
cp -a "$src"/CMakeLists.txt "$src"/cmake "$src"/include "$root/.ggml-src/"
find "$src/src" -maxdepth 1 -type f -exec cp {} "$root/.ggml-src/src/" \;
# ggml-base includes a few CPU headers (ggml-cpu/*.h); the CPU backend is not built.
cp -a "$src/src/ggml-cuda" "$src/src/ggml-cpu" "$root/.ggml-src/src/"
# The crate's copy lacks the pkg-config template that ggml's CMakeLists reads.
touch "$root/.ggml-src/ggml.pc.in"
echo "llama-cpp-sys-2 $version" > "$root/.ggml-src/VERSION"

rm -rf "$root/.gpu-carry"
mkdir -p "$root/.gpu-carry"
cp "$bin/tempo9" "$root/.gpu-carry/"
strip "$root/.gpu-carry/tempo9"
for l in libggml-base.so.0 libggml.so.0 libggml-cpu.so.0; do
    cp -L "$bin/$l" "$root/.gpu-carry/"
done
du -sh "$root/.ggml-src" "$root/.gpu-carry"
"$root/.gpu-carry/tempo9" --version
