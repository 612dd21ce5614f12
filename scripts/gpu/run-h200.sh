#!/usr/bin/env bash
# On the H200 (through the `run` tool, carrying .ggml-src and .gpu-carry): build the
# CUDA backend, write synthetic models, check GPU greedy tokens against the CPU's,
# and benchmark. Results land in $OUT (JSON lines + logs).
#
# Usage: scripts/gpu/run-h200.sh [STEP...]
#   steps: build synth parity bench streams variants pack
#   (default: build synth parity bench streams)
#   build   builds libggml-cuda.so (~3 min), or unpacks it from .gpu-cache/ parts that an
#           earlier `pack` returned (same source and flags; saves the build; checked by sha256)
#   variants  bench with CUDA graphs off / ggml's graph optimisation on, for attribution
#   pack    xz-compresses the built library into $OUT parts (files come back <= 16 MiB)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/tempo9-gpu-out}
work=${WORK:-/dev/shm/tempo9-gpu}
T="$root/.gpu-carry/tempo9"
mkdir -p "$out" "$work"
steps=${*:-build synth parity bench streams}
has() { [[ " $steps " == *" $1 "* ]]; }
say() { echo "== $* ($(date +%T))"; }

if has build; then
    say build
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv >>"$out/run.log"
    if ls "$root"/.gpu-cache/libggml-cuda.so.xz.part* >/dev/null 2>&1; then
        cat "$root"/.gpu-cache/libggml-cuda.so.xz.part* | xz -dc >"$root/.gpu-carry/libggml-cuda.so"
        (cd "$root/.gpu-cache" && sed "s|  .*|  $root/.gpu-carry/libggml-cuda.so|" libggml-cuda.so.sha256 | sha256sum -c -) || exit 1
        echo "reassembled libggml-cuda.so from .gpu-cache parts"
    elif ! bash "$root/scripts/gpu/build-cuda.sh" >"$work/build.log" 2>&1; then
        tail -40 "$work/build.log"; exit 1
    else
        tail -1 "$work/build.log"; tail -3 "$work/build.log" >>"$out/run.log"
    fi
fi

if has synth; then
    say synth
    $T synth-gguf --arch llama --preset 135m --quant q4_k --out "$work/llama-135m-q4_k.gguf"
    $T synth-gguf --arch qwen2 --preset 0.5b --quant q4_k --out "$work/qwen2-0.5b-q4_k.gguf"
    $T synth-gguf --arch llama --preset 8b --quant q4_k --unique-mib 4 --out "$work/llama-8b-q4_k.gguf"
fi

if has parity; then
    say parity
    for m in llama-135m-q4_k qwen2-0.5b-q4_k; do
        $T check-device --gguf "$work/$m.gguf" --device cuda --prompts 8 --tokens 32 \
            2>>"$out/run.log" | tee -a "$out/results.jsonl"
    done
    # auto picks the GPU when the library loads
    $T run --gguf "$work/llama-135m-q4_k.gguf" --device auto --raw --temperature 0 --max-tokens 4 hi \
        2>&1 >/dev/null | grep -q "generated" && echo "device auto: ok"
fi

if has bench; then
    say bench
    for m in llama-8b-q4_k llama-135m-q4_k; do
        TEMPO9_LOG=info $T bench --gguf "$work/$m.gguf" --device cuda --pp 512 --tg 128 --reps 3 \
            2>>"$out/run.log" | tee -a "$out/results.jsonl"
    done
fi
if has streams; then
    say streams
    $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda --streams 1,8,32,64 \
        --stream-prompt 128 --tg 128 2>>"$out/run.log" | tee -a "$out/results.jsonl"
fi

if has variants; then
    say variants
    m=llama-8b-q4_k
    GGML_CUDA_DISABLE_GRAPHS=1 $T bench --gguf "$work/$m.gguf" --device cuda --pp 0 --tg 128 --reps 3 \
        2>>"$out/run.log" | sed 's/^{/{"variant":"GGML_CUDA_DISABLE_GRAPHS=1",/' | tee -a "$out/results.jsonl"
    GGML_CUDA_GRAPH_OPT=1 $T bench --gguf "$work/$m.gguf" --device cuda --pp 0 --tg 128 --reps 3 \
        2>>"$out/run.log" | sed 's/^{/{"variant":"GGML_CUDA_GRAPH_OPT=1",/' | tee -a "$out/results.jsonl"
    TEMPO9_LOG=ggml=debug $T bench --gguf "$work/$m.gguf" --device cuda --pp 0 --tg 32 --reps 1 2>&1 >/dev/null \
        | grep -o "CUDA graph[a-z ]*\|warmup [a-z]*" | sort | uniq -c
fi

if has pack; then
    say pack
    lib="$root/.gpu-carry/libggml-cuda.so"
    (cd "$(dirname "$lib")" && sha256sum libggml-cuda.so) >"$out/libggml-cuda.so.sha256"
    xz -T0 -3 -c "$lib" | split -b 15M -d - "$out/libggml-cuda.so.xz.part"
    ls -la "$out"
fi
say done
