#!/usr/bin/env bash
# On the H200 (through the `run` tool, carrying .ggml-src and .gpu-carry): build the
# CUDA backend, write synthetic models, check GPU greedy tokens against the CPU's,
# and benchmark. Results land in $OUT (JSON lines + logs).
#
# Usage: scripts/gpu/run-h200.sh [STEP...]
#   steps: build synth parity bench streams variants pdl pdlparity llamabench ncu steps64 ncu64 depth prefix cold offload suite stash real qwen qwenbig qwenbench ab35 ncu35 ncu35d batched35 batched30 pdlprobe pdlfa pdlbisect hybridbench hybridbench1 hybridbench2 mtp35 host35 arch30 vision32 vision32g sdk34 pack bundle
#   (default: build synth parity bench streams)
#   build   builds libggml-cuda.so (~3 min), or unpacks it from .gpu-cache/ parts that an
#           earlier `pack` returned (same source and flags; saves the build; checked by sha256;
#           only when .gpu-cache/libggml-cuda.recipe matches the crate version and the
#           build and patch scripts, else it builds, from .ggml-src)
#   variants  bench with CUDA graphs off / ggml's graph optimisation on, for attribution
#   pdl     8B decode with programmatic dependent launch on (ggml's default; Tempo9 turns it off)
#   pdlparity  the parity check (alone and batched) with PDL on, to see whether the wrong
#           numbers that made Tempo9 turn it off (see crates/cli/src/device.rs) remain
#   llamabench  builds llama.cpp's llama-bench from .llama-src (started in the background
#           by `build`) and runs pp512/tg128 -fa 1 on the 8B file, PDL default and off
#   ncu     per-kernel GPU time and DRAM bytes of a few 8B decode steps (Nsight Compute),
#           Tempo9 and llama-bench; analyse with scripts/gpu/ncu-steps.py
#   steps64 the engine's step log at 64 streams: median plan / assemble / forward / sample
#           ms of the steady decode steps (scripts/gpu/step-log.py)
#   ncu64   per-kernel GPU time of whole steps of a 64-stream run (Nsight Compute,
#           ncu-steps.py --by-step)
#   depth   decode at a 10K-token context, Tempo9 and llama-bench (-d 10240)
#   prefix  prefix hit at a 10K-token shared prefix (bench --streams 1,8 --shared-prefix 10240)
#   cold    cold prefill of a 10K-token prompt: in the engine with COLD_STEPS chunk sizes
#           (default 512 2048; the step and forward logs come back in cold-logs.tar.gz), and over
#           HTTP (scripts/gpu/cold-http.py: a fresh server's first long prompt, a second
#           one, a warm one; llama-server too when carried; COLD_VARIANTS: Tempo9 flag sets,
#           `;`-separated)
#   offload partial offload (--gpu-layers): greedy tokens vs CPU and vs the whole
#           model on the GPU (135m, 0.5b), and 8B speed with half the layers on the GPU
#   suite   the benchmark suite's agents-10k and prefix-hit scenarios against `tempo9
#           serve --device cuda` on the 8B file, over HTTP like on the CPU (needs synth;
#           the synthetic vocabulary merges only letter pairs, so prompt sizes are given
#           at a third: ~3.4K "suite tokens" are ~10K tokens of this model, as the
#           server-reported prompt tokens in the results show). With .llama-server
#           carried (prepare.sh), llama.cpp's llama-server runs the same scenarios on
#           the same file and CUDA library, side by side
#   stash   keeps the carried .gpu-model/N part (scripts/gpu/stage-model.sh) in /dev/shm,
#           for a later call's `real`
#   real    reassembles the staged real GGUF (all parts stashed; sha256 checked), then
#           greedy parity GPU vs CPU on it (chat prompts through its template, and random
#           ids; alone and batched) and its decode speed; with .llama-src carried, also
#           llama.cpp's own CPU and CUDA generations of the same prompts
#           (scripts/gpu/llama-greedy.cpp), compared by scripts/gpu/greedy-compare.py
#   qwen    the Qwen3 family: the four tiny test files (qwen3, qwen3moe, qwen35, qwen35moe;
#           real vocabularies carried in .gpu-carry/vocab) greedy on CUDA against the CPU
#           (check-device) and against llama.cpp's own CPU and CUDA runs of the same
#           prompts (llama-greedy, needs .llama-src)
#   qwenbig the Qwen3.5-35B-A3B shape (q3_k, MTP block included) and the Qwen3-30B-A3B
#           shape (q4_k) written with synth-gguf; single-stream pp512 / tg256 and
#           1/8/32/64 streams on each
#   qwenbench  llama-bench -p 512 -n 256 -fa 1 on the two published shapes (after `qwenbig`)
#   ab35    the hybrid file's pp512 / tg256 with .gpu-carry/tempo9-pre.xz (an earlier
#           binary to compare) and HEAD alternated, then HEAD with GGML_CUDA_PDL=1, then
#           llama-bench on the same file (with .llama-src)
#   ncu35   kernel time of a 512-token prompt step on the hybrid file, Tempo9 and
#           llama-bench (Nsight Compute), summed per kernel name
#   ncu35d  kernel time of decode steps on the hybrid file, Tempo9 and llama-bench (Nsight
#           Compute; NCU_SKIP / NCU_COUNT launches)
#   batched35  1/8/32/64 streams on the hybrid file, Tempo9 and llama-batched-bench
#   batched30  the same on the Qwen3-30B-A3B shape (Q4_K, written with synth-gguf)
#   pdlprobe  the 0.5B Qwen2 shape's GPU-vs-CPU greedy check with PDL off, on, and on
#           without CUDA graphs; with .llama-src, llama.cpp's own CUDA tokens with PDL
#           on and off against its CPU run (pdl-compare.jsonl, raw in pdl-raw.tar.gz)
#   pdlfa   Tempo9's PDL default (on but for flash attention) against PDL off: greedy
#           check on the 135M/0.5B shapes and 8B decode speed (after build and synth)
#   pdlbisect  ggml-cuda rebuilt with PDL limitable by op (scripts/gpu/pdl-ops.py; carry
#           .ggml-src), then the 0.5B Qwen2 shape's GPU-vs-CPU check with PDL on for one op
#           at a time and for all ops but one (pdlbisect.jsonl)
#   hybridbench1, hybridbench2  the benchmark suite on the hybrid Qwen3.5-35B-A3B shape (40
#           layers, Q3_K, MTP block; written by synth-gguf like `qwenbig`'s file but with the
#           qwen35 vocabulary and the Qwen3.5 chat template carried in .gpu-carry/vocab, so
#           suite sizes are real tokens; suite key qwen35moe-35b), Tempo9 against llama-server
#           from the same CUDA build (.llama-server carried; Tempo9 alone otherwise).
#           hybridbench1: agents-1.5k (3 rounds) and agents-10k (2 rounds); hybridbench2:
#           prefix-hit (15K prefix, 3 warm), startup-memory (8K/32K/64K/128K) and
#           fill-memory (4K/16K/31K in 32K); GPU memory from nvidia-smi. Each fits one
#           600 s call with `build` (unpacked from .gpu-cache) and the file's writing, and so
#           does `hybridbench` (both halves: ~5.5 min measured on 2026-12-03); every suite
#           run's --timeout-s is cut to what is left of HYBRID_DEADLINE (default 570 s from
#           the script's start). Carry .gpu-carry .llama-server and .gpu-cache (or .ggml-src).
#           HYBRID_LOG=1: the Tempo9 servers' step logs come back in server-logs.tar.gz;
#           HYBRID_VARIANT="FLAGS": a second Tempo9 server with these flags, side by side
#   mtp35   single-stream decode of a chat prompt on the hybrid file with the MTP head
#           drafting k = 1..4 (its random drafts all rejected: the cost per drafted
#           token) against no drafts (MTP35_VARIANTS to choose the runs)
#   host35  where a batch-1 decode step's host time goes on the hybrid file: the engine's
#           step and forward logs (plan / assemble / build / inputs / compute / sample ms,
#           host35.txt), and with Nsight Systems (when the image has nsys) the CUDA API
#           calls per decode step of Tempo9 and llama-bench (host35-nsys.txt)
#   arch30  issue 30's shapes: GPT-OSS-20B (MXFP4 experts) and Gemma-4-26B-A4B written by
#           synth-gguf; pp512/tg256 Tempo9 and llama-bench alternated, 1/8/32 streams
#           against llama-batched-bench; and the tiny gpt-oss/gemma4/gemma4moe/llama3/
#           mistral3 files' greedy tokens on CUDA against the CPU (check-device) and
#           against llama.cpp's own CPU and CUDA runs (llama-greedy), as `qwen` does;
#           ARCH30_SHAPES / ARCH30_TINY: which big shapes / tiny presets (space-separated);
#           ARCH30_SINGLE=0 skips the single-stream pairs, ARCH30_STREAMS (default 1,8,32)
#           and ARCH30_STREAM_REPS (alternated Tempo9 / llama-batched-bench pairs, default 1)
#   vision32  issue 32 on the GPU: the tiny Qwen3-VL pair's greedy answers about 5 images
#           with encoder and model on CUDA against both on the CPU (bench/vision/gpu_vs_cpu.py);
#           then the Qwen3-VL-30B-A3B shape (Q4_K language model, F16 projector, both
#           synth-gguf): 4 streams decoding while a 5th request sends a new image every
#           second, with the encoder inside the decode step (--vision-inline), on its own
#           thread and GPU stream, and on the CPU, and text prompts of the same length
#           instead of images (the prefill alone; bench/vision/encode_while_decode.py);
#           with .llama-src, llama-mtmd-cli's encode time on the same files.
#           With .llama-server carried, llama.cpp's llama-server serves the same clients
#           (variant llama). VISION32_SIZE (default 768x768), VISION32_WINDOW (s, default 15),
#           VISION32_REPS (repetitions, alternating the variants' order; default 1),
#           VISION32_VARIANTS (default "inline stream text cpu llama"; also stream-noprio: the
#           decode steps' streams at the default priority; greenP: the encoder on P% of the
#           SMs, --vision-sm-share P), VISION32_PARITY=0
#           skips the tiny pair's GPU-vs-CPU answers
#   vision32g  the tiny Gemma 4 pair (gemma4-tiny with Gemma 4's vocabulary and template from
#           .gpu-carry/vocab, and its tiny gemma4v projector): greedy answers about 5 images
#           on CUDA against the CPU (bench/vision/gpu_vs_cpu.py)
#   sdk34   the SDK in process on CUDA (issue 34): crates/tempo9/examples/bench (staged by
#           prepare.sh with SDK_BENCH=1) against `tempo9 bench`, and its first token against
#           HTTP, on the synthetic 8B file; SDK34_ROUNDS (default 3)
#   bundle  (last) packs every output but the library parts into bundle.tar.gz
#   pack    xz-compresses the built library into $OUT parts (files come back <= 16 MiB)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/tempo9-gpu-out}
work=${WORK:-/dev/shm/tempo9-gpu}
T="$root/.gpu-carry/tempo9"
# prepare.sh packs the binary (tempo9.xz); unpacked next to the ggml libraries it loads.
if [ ! -x "$T" ] && [ -f "$T.xz" ]; then
    xz -dc "$T.xz" >"$T" && chmod +x "$T"
fi
mkdir -p "$out" "$work"
steps=${*:-build synth parity bench streams}
# .llama-src.tar.xz (prepare.sh): the same source packed, ~2.5 MB instead of ~17, so that
# it fits the carry limit next to .gpu-carry and .gpu-cache.
if [ ! -d "$root/.llama-src" ] && [ -f "$root/.llama-src.tar.xz" ]; then
    tar -C "$root" -xJf "$root/.llama-src.tar.xz"
fi
has() { [[ " $steps " == *" $1 "* ]]; }
say() { echo "== $* ($(date +%T))"; }
# llama.cpp's llama-server (staged by prepare.sh) with the CUDA backend built from the
# same ggml source next to it: unpacked once; sets LLAMA_CPP_BIN_DIR and succeeds
# when it sees the GPU. This llama-server is a CPU build: it loads other backends
# only when asked for a device by name (with a built-in backend, llama_backend_init
# skips ggml_backend_load_all), so callers pass --device CUDA0.
llama_server_ready() {
    [ -f "$root/.llama-server/bin.tar.xz" ] || return 1
    local lb="$work/llama-bin"
    if [ ! -x "$lb/llama-server" ]; then
        mkdir -p "$lb" && tar -C "$lb" -xJf "$root/.llama-server/bin.tar.xz"
        cp "$root/.gpu-carry/libggml-cuda.so" "$lb/"
        cp "$root/.llama-server/build_info.json" "$work/" 2>/dev/null || true
    fi
    # (the staged build may lack an $ORIGIN rpath; the suite passes its directory in
    # LD_LIBRARY_PATH to llama-server alone)
    LD_LIBRARY_PATH="$lb" "$lb/llama-server" --list-devices 2>&1 | tee -a "$out/run.log" | grep -q CUDA0 || return 1
    export LLAMA_CPP_BIN_DIR="$lb"
}

# What a built libggml-cuda.so depends on besides its flags: the crate's ggml version and
# the scripts that patch and build it. `pack` records it next to the parts, and `build`
# reuses .gpu-cache parts only when it matches (a library of older patches is rebuilt).
lib_recipe() {
    { grep -A1 '^name = "llama-cpp-sys-2"' "$root/Cargo.lock"
      cat "$root"/scripts/gpu/build-cuda.sh "$root"/scripts/gpu/pdl-ops.py "$root"/scripts/gpu/stream-priority.py "$root"/scripts/gpu/green-ctx.py
    } | sha256sum | cut -d' ' -f1
}

if has build; then
    say build
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv >>"$out/run.log"
    if ls "$root"/.gpu-cache/libggml-cuda.so.xz.part* >/dev/null 2>&1 \
        && [ "$(cat "$root/.gpu-cache/libggml-cuda.recipe" 2>/dev/null)" = "$(lib_recipe)" ]; then
        cat "$root"/.gpu-cache/libggml-cuda.so.xz.part* | xz -dc >"$root/.gpu-carry/libggml-cuda.so"
        (cd "$root/.gpu-cache" && sed "s|  .*|  $root/.gpu-carry/libggml-cuda.so|" libggml-cuda.so.sha256 | sha256sum -c -) || exit 1
        echo "reassembled libggml-cuda.so from .gpu-cache parts"
    elif ! bash "$root/scripts/gpu/build-cuda.sh" >"$work/build.log" 2>&1; then
        tail -40 "$work/build.log"; exit 1
    else
        tail -1 "$work/build.log"; tail -3 "$work/build.log" >>"$out/run.log"
    fi
fi

if { has llamabench || has host35 || has arch30 || has real || has qwen || has qwenbench || has pdlprobe || has ab35 || has ncu35 || has ncu35d || has batched35 || has batched30 || has vision32; } && [ -d "$root/.llama-src" ]; then
    # CPU-only compile; overlaps the synthetic model writing below.
    bash "$root/scripts/gpu/llama-bench.sh" build >"$work/llama-build.log" 2>&1 &
    llama_build=$!
fi

if has synth; then
    say synth
    $T synth-gguf --arch llama --preset 135m --quant q4_k --out "$work/llama-135m-q4_k.gguf"
    $T synth-gguf --arch qwen2 --preset 0.5b --quant q4_k --out "$work/qwen2-0.5b-q4_k.gguf"
    $T synth-gguf --arch llama --preset 8b --quant q4_k --unique-mib 4 --out "$work/llama-8b-q4_k.gguf"
fi

if has vision32; then
    # vision32's files, written while llama.cpp compiles.
    say vision32 files
    $T synth-gguf --preset qwen3vl-tiny --quant q8_0 --seed 1 --out "$work/qwen3vl-tiny.gguf" >>"$out/run.log" 2>&1
    $T synth-gguf --projector qwen3vl-tiny --out "$work/mmproj-qwen3vl-tiny.gguf" >>"$out/run.log" 2>&1
    [ -f "$work/qwen3-vl-30b-a3b-q4_k.gguf" ] || $T synth-gguf --preset qwen3-vl-30b-a3b --quant q4_k \
        --unique-mib 4 --out "$work/qwen3-vl-30b-a3b-q4_k.gguf" >>"$out/run.log" 2>&1
    [ -f "$work/mmproj-qwen3-vl-30b-a3b-f16.gguf" ] || $T synth-gguf --projector qwen3-vl-30b-a3b \
        --out "$work/mmproj-qwen3-vl-30b-a3b-f16.gguf" >>"$out/run.log" 2>&1
    ls -la "$work"/*qwen3*vl*.gguf >>"$out/run.log"
fi

# Timed steps below: let the llama.cpp compile finish first (it takes every core).
if [ -n "${llama_build:-}" ]; then
    wait "$llama_build"; llama_rc=$?
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

if has pdlparity; then
    say pdlparity
    for m in llama-135m-q4_k qwen2-0.5b-q4_k; do
        GGML_CUDA_PDL=1 $T check-device --gguf "$work/$m.gguf" --device cuda --prompts 8 --tokens 32 \
            2>>"$out/run.log" | sed 's/^{/{"variant":"GGML_CUDA_PDL=1",/' | tee -a "$out/results.jsonl"
    done
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

if has pdl; then
    say pdl
    GGML_CUDA_PDL=1 $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda --pp 0 --tg 128 --reps 3 \
        2>>"$out/run.log" | sed 's/^{/{"variant":"GGML_CUDA_PDL=1",/' | tee -a "$out/results.jsonl"
fi

if has llamabench; then
    say llamabench
    if [ "${llama_rc:-1}" = 0 ]; then
        tail -1 "$work/llama-build.log" | tee -a "$out/run.log"
        LB="bash $root/scripts/gpu/llama-bench.sh run $work/llama-8b-q4_k.gguf"
        for pdl in default 0; do
            env $([ $pdl = 0 ] && echo GGML_CUDA_PDL=0) $LB -p 512 -n 128 -fa 1 -r 3 -o jsonl \
                2>>"$out/run.log" | sed "s/^{/{\"pdl\":\"$pdl\",/" | tee -a "$out/llama-bench.jsonl"
        done
    else
        tail -30 "$work/llama-build.log"
    fi
fi

NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

if has steps64; then
    say steps64
    # Where a steady 64-stream decode step's time goes: the engine's step log splits
    # plan / assemble / forward (graph compute incl. GPU wait) / sample.
    TEMPO9_LOG=info,tempo9_engine=debug $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda \
        --streams 64 --stream-prompt 128 --tg 64 2>"$work/steps64.log" \
        | sed 's/^{/{"variant":"steps64",/' | tee -a "$out/results.jsonl"
    python3 "$root/scripts/gpu/step-log.py" "$work/steps64.log" 64 | tee "$out/steps64.txt"
fi

if has ncu64; then
    say ncu64
    # Kernels of whole steps of a 64-stream run (128-token prompts, then decoding),
    # GPU time only (one replay pass), a window of launches past the first steps. Under
    # the profiler steps are slow, so the ITL target shrinks prompt chunks: the window
    # holds mixed steps of ~100-140 rows (prompt chunks plus decode rows).
    timeout 400 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        --print-kernel-base function --launch-skip 9000 --launch-count 3500 \
        --log-file "$out/ncu64-tempo9.csv" $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda \
        --streams 64 --stream-prompt 128 --tg 4 >/dev/null 2>>"$out/run.log"; echo "ncu rc=$?"
    python3 "$root/scripts/gpu/ncu-steps.py" --by-step "$out/ncu64-tempo9.csv" | tee "$out/ncu64.txt"
fi

if has ncu; then
    say ncu
    metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
    nc() { timeout 150 "$NCU" --clock-control none --metrics $metrics --csv --print-units base \
        --print-kernel-base function --log-file "$1" "${@:2}" >/dev/null 2>>"$out/run.log"; echo "ncu rc=$?"; }
    # 2 warm-up steps (3-token prompt, 1 decode), then 1 + 3 single-token steps.
    nc "$out/ncu-tempo9.csv" $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda --pp 0 --tg 4 --reps 1
    [ -x /tmp/llama-build/bin/llama-bench ] && nc "$out/ncu-llama.csv" \
        env LD_LIBRARY_PATH=/tmp/llama-build/bin /tmp/llama-build/bin/llama-bench \
        -m "$work/llama-8b-q4_k.gguf" -p 0 -n 4 -r 1 -fa 1 --no-warmup -o jsonl
    ls -la "$out"
fi

if has depth; then
    say depth
    # Decode at a 10K-token context: Tempo9 (one request, 10240 prompt tokens) and llama-bench -d.
    $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda --streams 1 --stream-prompt 10240 --tg 128 \
        2>>"$out/run.log" | sed 's/^{/{"variant":"depth10240",/' | tee -a "$out/results.jsonl"
    [ -x /tmp/llama-build/bin/llama-bench ] && bash "$root/scripts/gpu/llama-bench.sh" run \
        "$work/llama-8b-q4_k.gguf" -p 0 -n 128 -d 10240 -fa 1 -r 2 -o jsonl 2>>"$out/run.log" \
        | sed 's/^{/{"pdl":"default",/' | tee -a "$out/llama-bench.jsonl"
fi

if has prefix; then
    say prefix
    # Prefix hit at a 10K-token shared prefix through the engine API: a first request
    # caches the prefix (cold TTFT), then 1 and 8 requests with their own 64-token
    # suffixes reuse it (warm TTFT; decode over shared + own pages).
    $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda --streams 1,8 --shared-prefix 10240 \
        --stream-prompt 64 --tg 128 2>>"$out/run.log" | sed 's/^{/{"variant":"prefix10240",/' \
        | tee -a "$out/results.jsonl"
fi

if has cold; then
    say cold
    logs="$work/cold-logs"
    mkdir -p "$logs"
    for st in ${COLD_STEPS:-512 2048}; do
        TEMPO9_LOG=info,tempo9_engine=debug,tempo9_models=debug $T bench --gguf "$work/llama-8b-q4_k.gguf" \
            --device cuda --streams 1 --stream-prompt 10240 --tg 4 --step-tokens "$st" --solo-step-tokens "$st" 2>"$logs/cold-$st.log" \
            | sed "s/^{/{\"variant\":\"cold-step$st\",/" | tee -a "$out/results.jsonl"
    done
    llama_server_ready || echo "no llama-server for the GPU: Tempo9 only"
    IFS=';' read -ra cv <<<"${COLD_VARIANTS:-}"
    vx=(); for v in "${cv[@]}"; do vx+=("--tempo9-extra=--device=cuda $v"); done
    [ ${#vx[@]} = 0 ] && vx=("--tempo9-extra=--device=cuda")
    TEMPO9_LOG=info,tempo9_engine=debug,tempo9_models=debug python3 "$root/scripts/gpu/cold-http.py" \
        --log-dir "$logs" --model "$work/llama-8b-q4_k.gguf" --tempo9 "$T" \
        --llama-extra "--device CUDA0" "${vx[@]}" 2>&1 | tee -a "$out/cold-http.jsonl"
    tar -C "$work" -czf "$out/cold-logs.tar.gz" cold-logs
fi

if has offload; then
    say offload
    for mg in llama-135m-q4_k:15 qwen2-0.5b-q4_k:12 llama-135m-q4_k:0; do
        $T check-device --gguf "$work/${mg%%:*}.gguf" --device cuda --gpu-layers "${mg##*:}" \
            --prompts 8 --tokens 32 2>>"$out/run.log" | tee -a "$out/results.jsonl"
    done
    for n in 16 31; do
        $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda --gpu-layers $n --pp 512 --tg 32 --reps 1 \
            2>>"$out/run.log" | sed "s/^{/{\"gpu_layers\":$n,/" | tee -a "$out/results.jsonl"
    done
fi

if has suite; then
    say suite
    # The harness finds models by file name: serve the 8B file under the name it uses
    # for its "qwen" key (chars-per-token calibration only; the server reports real counts).
    mkdir -p "$work/models" "$out/suite"
    ln -sf "$work/llama-8b-q4_k.gguf" "$work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    engines=tempo9 lx=""
    note="H200, synthetic Llama-3.1-8B-shape Q4_K (random weights), Tempo9 on ggml's CUDA backend"
    if llama_server_ready; then
        engines=llamacpp,tempo9
        lx="--device CUDA0"
        note="$note; llama.cpp: llama-server of $(cat "$root/.llama-server/VERSION" 2>/dev/null) with the same CUDA backend library, its defaults (all layers on the GPU) and --device CUDA0"
    else
        echo "no llama-server for the GPU: Tempo9 only"
    fi
    S=(python3 "$root/bench/suite/run.py" --engines "$engines" --model qwen --models-dir "$work/models"
       --tempo9 "$T" --tempo9-extra=--device=cuda "--llama-extra=$lx" --out-dir "$out/suite")
    # -c for llama.cpp: the four agents' histories (up to ~16K tokens each at round 2,
    # ~3 tokens per suite token) in its one unified KV cache; Tempo9 takes it as the
    # per-request limit.
    # SUITE_VARIANTS: system prompt sizes in suite tokens (500 ~ 1.5K, 3400 ~ 10K tokens
    # of this model); SUITE_INTERLEAVE=N: N repetitions, rounds back to back (run.py
    # --interleave); SUITE_SCENARIO: the result name (agents-10k, or agents for both
    # sizes; none: no agents run); SUITE_PREFIX=0 skips prefix-hit; SUITE_TAG tags both.
    # SUITE_T9_VARIANT: flags of one more Tempo9 server (run.py --tempo9-variant), for A/B.
    vt=(); [ -n "${SUITE_T9_VARIANT:-}" ] && vt=(--tempo9-variant "$SUITE_T9_VARIANT")
    [ "${SUITE_SCENARIO:-}" = none ] || "${S[@]}" "${SUITE_SCENARIO:-agents-10k}" "${vt[@]}" --variant-tokens "${SUITE_VARIANTS:-3400}" --rounds 2 --ctx 73728 \
        --interleave "${SUITE_INTERLEAVE:-0}" --timeout-s "${SUITE_TIMEOUT:-330}" --tag "${SUITE_TAG:-}" \
        --note "$note" 2>&1 | tail -30
    if [ "${SUITE_PREFIX:-1}" != 0 ]; then
        "${S[@]}" prefix-hit --prefix-sizes 3400 --ctx 16384 --timeout-s 150 --tag "${SUITE_TAG:-}" \
            --note "$note" 2>&1 | tail -15
    fi
fi

if has stash; then
    say stash
    mkdir -p "$work/model-parts"
    for d in "$root"/.gpu-model/*/; do
        [ -f "$d/MANIFEST" ] || continue
        cp "$d"/part* "$d/MANIFEST" "$work/model-parts/"
    done
    ls -la "$work/model-parts"
fi

if has real; then
    say real
    read -r name sum n <"$work/model-parts/MANIFEST" || { echo "no stashed model"; exit 1; }
    have=$(ls "$work"/model-parts/part* | wc -l)
    [ "$have" = "$n" ] || { echo "stashed $have of $n parts"; exit 1; }
    real="$work/$name"
    [ -f "$real" ] || cat "$work"/model-parts/part* | xz -dc >"$real"
    echo "$sum  $real" | sha256sum -c - || exit 1
    cmp="python3 $root/scripts/gpu/greedy-compare.py"
    # llama.cpp's own CPU-vs-CUDA differences on the same prompts, as the yardstick
    # (carry .llama-src: libllama is built in the background by `build`).
    lg=""
    if [ "${llama_rc:-1}" = 0 ]; then
        lb=/tmp/llama-build
        g++ -O2 -std=c++17 -I"$root/.llama-src/include" -I"$root/.llama-src/ggml/include" \
            "$root/scripts/gpu/llama-greedy.cpp" -L"$lb/bin" -lllama -lggml -lggml-base \
            -Wl,-rpath,"$lb/bin" -o "$lb/bin/llama-greedy" && lg="$lb/bin/llama-greedy"
    fi
    raw="$work/real-raw"
    mkdir -p "$raw"
    for kind in chat random; do
        flag=$([ $kind = chat ] && echo --chat)
        $T check-device --gguf "$real" --device cuda --prompts 8 --tokens 64 $flag \
            --dump "$raw/$kind.tempo9.json" 2>>"$out/run.log" | tee -a "$out/results.jsonl"
        [ -n "$lg" ] || continue
        $cmp prompts "$raw/$kind.tempo9.json" >"$raw/$kind.prompts.txt"
        CUDA_VISIBLE_DEVICES= $lg "$real" "$raw/$kind.prompts.txt" 64 0 \
            >"$raw/$kind.llama-cpu.jsonl" 2>>"$work/llama-greedy.log"
        $lg "$real" "$raw/$kind.prompts.txt" 64 99 \
            >"$raw/$kind.llama-cuda.jsonl" 2>>"$work/llama-greedy.log"
        $lg "$real" "$raw/$kind.prompts.txt" 64 99 batched \
            >"$raw/$kind.llama-cuda-batched.jsonl" 2>>"$work/llama-greedy.log"
        $cmp compare "$raw/$kind.tempo9.json" llama_cpu="$raw/$kind.llama-cpu.jsonl" \
            llama_cuda="$raw/$kind.llama-cuda.jsonl" \
            llama_cuda_batched="$raw/$kind.llama-cuda-batched.jsonl" \
            | sed "s/^{/{\"prompts\":\"$kind\",/" | tee -a "$out/real-compare.jsonl"
    done
    tar -C "$work" -czf "$out/real-raw.tar.gz" real-raw
    # Which devices llama.cpp's runs used, and any error (when it ran).
    [ -n "$lg" ] && grep -m3 -i "CUDA0\|error" "$work/llama-greedy.log"
    $T bench --gguf "$real" --device cuda --pp 512 --tg 128 --reps 3 \
        2>>"$out/run.log" | tee -a "$out/results.jsonl"
    $T bench --gguf "$real" --device cuda --streams 1,8,32,64 --stream-prompt 128 --tg 128 \
        2>>"$out/run.log" | tee -a "$out/results.jsonl"
fi

if has qwen; then
    say qwen
    V="$root/.gpu-carry/vocab"
    lg=$(llama_greedy_tool)
    raw="$work/qwen-raw"
    mkdir -p "$raw"
    for m in qwen3 qwen3moe qwen35 qwen35moe; do
        case $m in
            qwen35*) voc=ggml-vocab-qwen35.gguf; tpl=Qwen3.5-4B.jinja ;;
            # The qwen35 vocabulary file holds the qwen2 token list (one file to carry).
            *) voc=ggml-vocab-qwen35.gguf; tpl=Qwen-Qwen3-0.6B.jinja ;;
        esac
        f="$work/$m-tiny.gguf"
        $T synth-gguf --preset $m-tiny --vocab "$V/$voc" --template "$V/templates/$tpl" \
            --quant q8_0 --seed 1 --out "$f" 2>>"$out/run.log"
        sha256sum "$f" | tee -a "$out/run.log"
        greedy_vs_llama "$f" "$m" chat "$raw" "$out/qwen-compare.jsonl" --chat
        greedy_vs_llama "$f" "$m" random "$raw" "$out/qwen-compare.jsonl"
    done
    tar -C "$work" -czf "$out/qwen-raw.tar.gz" qwen-raw
    [ -n "$lg" ] && grep -m3 -i "CUDA0\|error" "$work/llama-greedy.log"
fi

if has qwenbig; then
    say qwenbig
    $T synth-gguf --preset qwen3.5-35b-a3b --mtp --quant q3_k --unique-mib 4 \
        --out "$work/qwen35moe-35b-a3b-q3_k.gguf" 2>>"$out/run.log"
    $T synth-gguf --preset qwen3-30b-a3b --quant q4_k --unique-mib 4 \
        --out "$work/qwen3moe-30b-a3b-q4_k.gguf" 2>>"$out/run.log"
    for m in qwen35moe-35b-a3b-q3_k qwen3moe-30b-a3b-q4_k; do
        ls -la "$work/$m.gguf" | tee -a "$out/run.log"
        $T bench --gguf "$work/$m.gguf" --device cuda --pp 512 --tg 256 --reps 3 \
            2>>"$out/run.log" | sed "s/^{/{\"model\":\"$m\",/" | tee -a "$out/results.jsonl"
        $T bench --gguf "$work/$m.gguf" --device cuda --streams 1,8,32,64 --stream-prompt 128 --tg 128 \
            2>>"$out/run.log" | sed "s/^{/{\"model\":\"$m\",/" | tee -a "$out/results.jsonl"
    done
fi

if has qwenbench; then
    say qwenbench
    if [ "${llama_rc:-1}" = 0 ]; then
        for m in qwen35moe-35b-a3b-q3_k qwen3moe-30b-a3b-q4_k; do
            bash "$root/scripts/gpu/llama-bench.sh" run "$work/$m.gguf" -p 512 -n 256 -fa 1 -r 3 -o jsonl \
                2>>"$out/run.log" | sed "s/^{/{\"model\":\"$m\",/" | tee -a "$out/llama-bench.jsonl"
        done
    else
        tail -30 "$work/llama-build.log"
    fi
fi

# The hybrid Qwen3.5-35B-A3B-shape file of the suite steps (40 layers, Q3_K, MTP block,
# qwen35 vocabulary and chat template from .gpu-carry/vocab): written once per machine.
hf="$work/models/qwen35moe-35b-a3b-q3_k-chat.gguf"  # bench/suite/engines.py MODELS["qwen35moe-35b"]
write_hybrid_file() {
    [ -f "$hf" ] && return 0
    local V="$root/.gpu-carry/vocab" t0=$SECONDS
    [ -f "$V/ggml-vocab-qwen35.gguf" ] && [ -f "$V/templates/Qwen3.5-4B.jinja" ] || {
        echo "no qwen35 vocabulary/template in .gpu-carry/vocab (scripts/gpu/prepare.sh stages them)"; return 1; }
    mkdir -p "$work/models"
    $T synth-gguf --preset qwen3.5-35b-a3b --mtp --quant q3_k --unique-mib 4 \
        --vocab "$V/ggml-vocab-qwen35.gguf" --template "$V/templates/Qwen3.5-4B.jinja" \
        --out "$hf.part" 2>>"$out/run.log" && mv "$hf.part" "$hf" || { echo "synth-gguf failed"; return 1; }
    echo "wrote $(basename "$hf") ($(du -h "$hf" | cut -f1)) in $((SECONDS - t0)) s" | tee -a "$out/run.log"
}

if has ab35; then
    say ab35
    # Issue 28's A/B on the hybrid file: the binary before e6536a5's MoE graph order
    # (.gpu-carry/tempo9-pre.xz, built with that commit's crates/models diff reverted)
    # and HEAD, alternated; HEAD with programmatic dependent launch on
    # (GGML_CUDA_PDL=1), to size what PDL is worth on this graph; llama-bench on the
    # same file when .llama-src was carried.
    write_hybrid_file || exit 1
    # (next to the ggml libraries it loads through its $ORIGIN rpath)
    pre="$root/.gpu-carry/tempo9-pre"
    [ -x "$pre" ] || { xz -dc "$root/.gpu-carry/tempo9-pre.xz" >"$pre" && chmod +x "$pre"; }
    # AB_VARIANTS: which runs, in order (pre, post, or post with environment settings).
    IFS=, read -ra variants <<<"${AB_VARIANTS:-pre,post,pre,post,post GGML_CUDA_PDL=1}"
    for v in "${variants[@]}"; do
        b=$T e=""; [ "$v" = pre ] && b=$pre; [ "$v" != "${v#post }" ] && e=${v#post }
        env $e $b bench --gguf "$hf" --device cuda --pp 512 --tg 256 --reps 1 2>>"$out/run.log" \
            | sed "s/^{/{\"model\":\"qwen35moe-35b-a3b-q3_k-chat\",\"variant\":\"$v\",/" | tee -a "$out/results.jsonl"
    done
    if [ "${llama_rc:-1}" = 0 ] && [ "${AB_LLAMA:-1}" != 0 ]; then
        bash "$root/scripts/gpu/llama-bench.sh" run "$hf" -p 512 -n 256 -fa 1 -r 2 -o jsonl \
            2>>"$out/run.log" | sed 's/^{/{"model":"qwen35moe-35b-a3b-q3_k-chat",/' | tee -a "$out/llama-bench.jsonl"
    fi
fi

if has ncu35; then
    say ncu35
    # Kernel time of a 512-token prompt step on the hybrid file (Nsight Compute, GPU time
    # only): Tempo9 (a 3-token warm-up prompt and one decode step before it) and
    # llama-bench (-p 512, no warm-up). Sum per kernel name: scripts/gpu/ncu-steps.py --sum.
    write_hybrid_file || exit 1
    nc() { timeout "${NCU_TIMEOUT:-170}" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
        --print-units base --print-kernel-base function --log-file "$1" "${@:2}" >/dev/null 2>>"$out/run.log"; echo "ncu rc=$?"; }
    nc "$out/ncu35-tempo9.csv" $T bench --gguf "$hf" --device cuda --pp 512 --tg 0 --reps 1
    [ "${llama_rc:-1}" = 0 ] && nc "$out/ncu35-llama.csv" env LD_LIBRARY_PATH=/tmp/llama-build/bin \
        /tmp/llama-build/bin/llama-bench -m "$hf" -p 512 -n 0 -r 1 -fa 1 --no-warmup -o jsonl
    python3 "$root/scripts/gpu/ncu-steps.py" --sum "$out"/ncu35-*.csv | tee "$out/ncu35.txt"
fi

if has ncu35d; then
    say ncu35d
    # Kernel time of decode steps on the hybrid file (Nsight Compute, GPU time only):
    # Tempo9's bench after its warm-up (a 3-token prompt and a decode step: NCU_SKIP
    # launches, default 3100) and llama-bench -p 0 -n 3 without warm-up; NCU_COUNT
    # kernels each (default 3000: two decode steps). Split per step:
    # scripts/gpu/ncu-steps.py --by-step (Tempo9) / the repeating period (llama).
    write_hybrid_file || exit 1
    nd() { timeout "${NCU_TIMEOUT:-170}" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
        --print-units base --print-kernel-base function --launch-count "${NCU_COUNT:-3000}" \
        --log-file "$1" "${@:2}" >/dev/null 2>>"$out/run.log"; echo "ncu rc=$?"; }
    nd "$out/ncu35d-tempo9.csv" --launch-skip "${NCU_SKIP:-3100}" $T bench --gguf "$hf" --device cuda --pp 1 --tg 4 --reps 1
    [ "${llama_rc:-1}" = 0 ] && nd "$out/ncu35d-llama.csv" env LD_LIBRARY_PATH=/tmp/llama-build/bin \
        /tmp/llama-build/bin/llama-bench -m "$hf" -p 0 -n 3 -r 1 -fa 1 --no-warmup -o jsonl
    python3 "$root/scripts/gpu/ncu-steps.py" "$out"/ncu35d-*.csv | tee "$out/ncu35d.txt"
fi

# Batched decode of FILE tagged MODEL: Tempo9 at 1/8/32/64 streams (128-token prompts, 128
# generated) into $out/results$SUFFIX.jsonl, and llama-batched-bench with the same sizes
# (S_TG: decode tokens/s over all sequences; same CUDA library) into
# $out/llama-batched$SUFFIX.jsonl. Usage: batched_vs_llama FILE MODEL SUFFIX
# llama.cpp's greedy runner (scripts/gpu/llama-greedy.cpp) against the CUDA build, when
# llama.cpp was built (needs .llama-src); prints its path, or nothing.
llama_greedy_tool() {
    [ "${llama_rc:-1}" = 0 ] || return 0
    local lb=/tmp/llama-build
    g++ -O2 -std=c++17 -I"$root/.llama-src/include" -I"$root/.llama-src/ggml/include" \
        "$root/scripts/gpu/llama-greedy.cpp" -L"$lb/bin" -lllama -lggml -lggml-base \
        -Wl,-rpath,"$lb/bin" -o "$lb/bin/llama-greedy" && echo "$lb/bin/llama-greedy"
}
# greedy_vs_llama FILE NAME KIND RAW_DIR COMPARE_JSONL [check-device flags]: Tempo9's CUDA
# greedy tokens against its CPU (check-device), then, with $lg set, against llama.cpp's own
# CPU and CUDA runs of the same prompts (scripts/gpu/greedy-compare.py).
greedy_vs_llama() {
    local f=$1 m=$2 kind=$3 raw=$4 cmpout=$5 cmp="python3 $root/scripts/gpu/greedy-compare.py"
    shift 5
    $T check-device --gguf "$f" --device cuda --prompts 10 --tokens 64 "$@" \
        --dump "$raw/$m.$kind.tempo9.json" 2>>"$out/run.log" \
        | sed "s/^{/{\"model\":\"$m-tiny\",/" | tee -a "$out/results.jsonl"
    [ -n "$lg" ] || return 0
    $cmp prompts "$raw/$m.$kind.tempo9.json" >"$raw/$m.$kind.prompts.txt"
    CUDA_VISIBLE_DEVICES= $lg "$f" "$raw/$m.$kind.prompts.txt" 64 0 \
        >"$raw/$m.$kind.llama-cpu.jsonl" 2>>"$work/llama-greedy.log"
    $lg "$f" "$raw/$m.$kind.prompts.txt" 64 99 \
        >"$raw/$m.$kind.llama-cuda.jsonl" 2>>"$work/llama-greedy.log"
    $cmp compare "$raw/$m.$kind.tempo9.json" llama_cpu="$raw/$m.$kind.llama-cpu.jsonl" \
        llama_cuda="$raw/$m.$kind.llama-cuda.jsonl" \
        | sed "s/^{/{\"model\":\"$m-tiny\",\"prompts\":\"$kind\",/" | tee -a "$cmpout"
}
batched_vs_llama() {
    $T bench --gguf "$1" --device cuda --streams 1,8,32,64 --stream-prompt 128 --tg 128 2>>"$out/run.log" \
        | sed "s/^{/{\"model\":\"$2\",/" | tee -a "$out/results$3.jsonl"
    if [ "${llama_rc:-1}" = 0 ] && [ -x /tmp/llama-build/bin/llama-batched-bench ]; then
        LD_LIBRARY_PATH=/tmp/llama-build/bin /tmp/llama-build/bin/llama-batched-bench -m "$1" -c 40960 \
            -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64 -fa 1 --output-format jsonl 2>>"$out/run.log" \
            | grep '^{' | tee -a "$out/llama-batched$3.jsonl"
    fi
}

if has batched35; then
    say batched35
    # Issue 28's batched decode on the hybrid file.
    write_hybrid_file || exit 1
    batched_vs_llama "$hf" qwen35moe-35b-a3b-q3_k-chat ""
fi

if has batched30; then
    say batched30
    # The Qwen3-30B-A3B shape (Q4_K, synthetic), batched like batched35.
    m30="$work/qwen3moe-30b-a3b-q4_k.gguf"
    [ -f "$m30" ] || $T synth-gguf --preset qwen3-30b-a3b --quant q4_k --unique-mib 4 --out "$m30" 2>>"$out/run.log"
    batched_vs_llama "$m30" qwen3moe-30b-a3b-q4_k 30
fi

if has pdlprobe; then
    say pdlprobe
    # Where PDL's wrong numbers come from (crates/cli/src/device.rs): the 0.5B Qwen2
    # shape's GPU-vs-CPU greedy check with PDL off, on, and on without CUDA graphs,
    # and llama.cpp's own CUDA generation of the same prompts with PDL on and off.
    m="$work/qwen2-0.5b-q4_k.gguf"
    [ -f "$m" ] || $T synth-gguf --arch qwen2 --preset 0.5b --quant q4_k --out "$m" 2>>"$out/run.log"
    raw="$work/pdl-raw"; mkdir -p "$raw"
    for v in "GGML_CUDA_PDL=0" "GGML_CUDA_PDL=1" "GGML_CUDA_PDL=1 GGML_CUDA_DISABLE_GRAPHS=1"; do
        tag=$(echo "$v" | tr ' =' '_-')
        env $v $T check-device --gguf "$m" --device cuda --prompts 8 --tokens 32 --dump "$raw/$tag.json" \
            2>>"$out/run.log" | sed "s/^{/{\"variant\":\"$v\",/" | tee -a "$out/results.jsonl"
    done
    if [ "${llama_rc:-1}" = 0 ]; then
        lb=/tmp/llama-build
        g++ -O2 -std=c++17 -I"$root/.llama-src/include" -I"$root/.llama-src/ggml/include" \
            "$root/scripts/gpu/llama-greedy.cpp" -L"$lb/bin" -lllama -lggml -lggml-base \
            -Wl,-rpath,"$lb/bin" -o "$lb/bin/llama-greedy" && lg="$lb/bin/llama-greedy"
        python3 "$root/scripts/gpu/greedy-compare.py" prompts "$raw/GGML_CUDA_PDL-0.json" >"$raw/prompts.txt"
        CUDA_VISIBLE_DEVICES= $lg "$m" "$raw/prompts.txt" 32 0 >"$raw/llama-cpu.jsonl" 2>>"$work/llama-greedy.log"
        for p in 0 1; do
            GGML_CUDA_PDL=$p $lg "$m" "$raw/prompts.txt" 32 99 >"$raw/llama-cuda-pdl$p.jsonl" 2>>"$work/llama-greedy.log"
            python3 "$root/scripts/gpu/greedy-compare.py" compare "$raw/GGML_CUDA_PDL-0.json" \
                llama_cpu="$raw/llama-cpu.jsonl" llama_cuda="$raw/llama-cuda-pdl$p.jsonl" \
                | sed "s/^{/{\"llama_pdl\":$p,/" | tee -a "$out/pdl-compare.jsonl"
        done
    fi
    tar -C "$work" -czf "$out/pdl-raw.tar.gz" pdl-raw
fi

if has pdlfa; then
    say pdlfa
    # Tempo9's PDL default (on but for flash attention, with a library that can limit
    # PDL by op: build-cuda.sh patches it so) against PDL off: greedy tokens against the
    # CPU (check-device, alone and batched) on the 135M Llama and 0.5B Qwen2 shapes,
    # then the 8B shape's decode speed, the two alternated (3 repetitions each).
    for m in llama-135m-q4_k qwen2-0.5b-q4_k; do
        for v in "TEMPO9_DEFAULT=1" "GGML_CUDA_PDL=0"; do
            env $v $T check-device --gguf "$work/$m.gguf" --device cuda --prompts 8 --tokens 32 \
                2>>"$out/run.log" | sed "s/^{/{\"variant\":\"$v\",/" | tee -a "$out/pdlfa.jsonl"
        done
    done
    for r in 1 2 3; do
        for v in "TEMPO9_DEFAULT=1" "GGML_CUDA_PDL=0"; do
            env $v $T bench --gguf "$work/llama-8b-q4_k.gguf" --device cuda --pp 0 --tg 128 --reps 1 \
                2>>"$out/run.log" | sed "s/^{/{\"variant\":\"$v\",\"rep\":$r,/" | tee -a "$out/pdlfa.jsonl"
        done
    done
fi

if has pdlbisect; then
    say pdlbisect
    # Which op's kernels give wrong numbers with PDL under CUDA graphs: ggml-cuda built
    # from .ggml-src patched by pdl-ops.py (PDL limited by op through GGML_CUDA_PDL_OPS /
    # GGML_CUDA_PDL_NOT_OPS), then the 0.5B Qwen2 shape's GPU-vs-CPU greedy check with PDL
    # on for one op at a time, and on for all ops but one.
    lib="$work/pdl-lib"; mkdir -p "$lib"
    python3 "$root/scripts/gpu/pdl-ops.py" "$root/.ggml-src" >>"$out/run.log" &&
        GGML_CUDA_BUILD_DIR=/tmp/ggml-pdl-build bash "$root/scripts/gpu/build-cuda.sh" "$lib" >"$work/pdl-build.log" 2>&1 ||
        { tail -30 "$work/pdl-build.log"; exit 1; }
    tail -1 "$work/pdl-build.log"
    m="$work/qwen2-0.5b-q4_k.gguf"
    [ -f "$m" ] || $T synth-gguf --arch qwen2 --preset 0.5b --quant q4_k --out "$m" 2>>"$out/run.log"
    probe() {
        env TEMPO9_BACKEND_DIR="$lib" "$@" $T check-device --gguf "$m" --device cuda --prompts ${PDL_PROMPTS:-4} \
            --tokens ${PDL_TOKENS:-16} 2>>"$out/run.log" | sed "s/^{/{\"variant\":\"$*\",/" | tee -a "$out/pdlbisect.jsonl"
    }
    probe GGML_CUDA_PDL=0
    probe GGML_CUDA_PDL=1
    for op in ${PDL_BISECT_OPS:-GET_ROWS RMS_NORM MUL MUL_MAT ADD ROPE SET_ROWS FLASH_ATTN_EXT GLU}; do
        probe GGML_CUDA_PDL=1 GGML_CUDA_PDL_OPS=$op
        probe GGML_CUDA_PDL=1 GGML_CUDA_PDL_NOT_OPS=$op
    done
fi

if has host35; then
    say host35
    write_hybrid_file || exit 1
    # The engine's own split: `step` lines (plan/assemble/forward/sample) and `forward`
    # lines (build/inputs/compute) of the steady single-stream decode steps.
    TEMPO9_LOG=info,tempo9_engine=debug,tempo9_models=debug $T bench --gguf "$hf" --device cuda \
        --pp 16 --tg 256 --reps 1 2>"$work/host35.log" \
        | sed 's/^{/{"variant":"host35",/' | tee -a "$out/results.jsonl"
    python3 "$root/scripts/gpu/step-log.py" "$work/host35.log" 1 | tee "$out/host35.txt"
    python3 - "$work/host35.log" <<'PY' | tee -a "$out/host35.txt"
import re, statistics, sys
ansi = re.compile(r"\x1b\[[0-9;]*m"); field = re.compile(r"(\w+)=([0-9.]+(?:e-?[0-9]+)?)")
rows = []
for line in open(sys.argv[1], errors="replace"):
    line = ansi.sub("", line)
    if " forward" in line and "compute_ms=" in line:
        d = {k: float(v) for k, v in field.findall(line)}
        if d.get("rows") == 1:
            rows.append(d)
rows = rows[len(rows) // 4:]  # steady steps only
for k in ("build_ms", "inputs_ms", "compute_ms"):
    print("forward %s median %.3f ms over %d single-row steps" % (k, statistics.median(r[k] for r in rows), len(rows)))
PY
    NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys \
        /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
    if [ -n "$NSYS" ]; then
        $NSYS profile -t cuda,nvtx -o "$work/t9" -f true $T bench --gguf "$hf" --device cuda \
            --pp 16 --tg 128 --reps 1 >/dev/null 2>>"$out/run.log"
        [ "${llama_rc:-1}" = 0 ] && $NSYS profile -t cuda,nvtx -o "$work/ll" -f true \
            bash "$root/scripts/gpu/llama-bench.sh" run "$hf" -p 0 -n 128 -r 1 -fa 1 >/dev/null 2>>"$out/run.log"
        for r in t9 ll; do
            [ -f "$work/$r.nsys-rep" ] || continue
            echo "### $r" >>"$out/host35-nsys.txt"
            $NSYS stats -r cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum -f csv \
                "$work/$r.nsys-rep" >>"$out/host35-nsys.txt" 2>&1
        done
        head -c 3000 "$out/host35-nsys.txt"
    else
        echo "no nsys in this image" | tee -a "$out/host35.txt"
    fi
fi

if has arch30; then
    say arch30
    for m in ${ARCH30_SHAPES-gpt-oss-20b gemma-4-26b-a4b}; do
        f="$work/$m.gguf"
        t0=$SECONDS
        $T synth-gguf --preset $m --unique-mib 4 --out "$f.part" 2>>"$out/run.log" && mv "$f.part" "$f" \
            || { echo "synth-gguf $m failed"; continue; }
        echo "wrote $m ($(du -h "$f" | cut -f1)) in $((SECONDS - t0)) s" | tee -a "$out/run.log"
        for rep in $([ "${ARCH30_SINGLE:-1}" = 1 ] && echo 1 2); do
            $T bench --gguf "$f" --device cuda --pp 512 --tg 256 --reps 1 2>>"$out/run.log" \
                | sed "s/^{/{\"model\":\"$m\",\"rep\":$rep,/" | tee -a "$out/results.jsonl"
            [ "${llama_rc:-1}" = 0 ] && bash "$root/scripts/gpu/llama-bench.sh" run "$f" -p 512 -n 256 -fa 1 -r 1 \
                -o jsonl 2>>"$out/run.log" | sed "s/^{/{\"model\":\"$m\",\"rep\":$rep,/" | tee -a "$out/llama-bench.jsonl"
        done
        npl=${ARCH30_STREAMS:-1,8,32}
        for rep in $(seq 1 "${ARCH30_STREAM_REPS:-1}"); do
            $T bench --gguf "$f" --device cuda --streams "$npl" --stream-prompt 128 --tg 128 2>>"$out/run.log" \
                | sed "s/^{/{\"model\":\"$m\",\"rep\":$rep,/" | tee -a "$out/results.jsonl"
            if [ "${llama_rc:-1}" = 0 ] && [ -x /tmp/llama-build/bin/llama-batched-bench ]; then
                LD_LIBRARY_PATH=/tmp/llama-build/bin /tmp/llama-build/bin/llama-batched-bench -m "$f" -c 20480 \
                    -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$npl" -fa 1 --output-format jsonl 2>>"$out/run.log" \
                    | grep '^{' | sed "s/^{/{\"model\":\"$m\",\"rep\":$rep,/" | tee -a "$out/llama-batched.jsonl"
            fi
        done
        rm -f "$f"
    done
    lg=$(llama_greedy_tool)
    raw="$work/arch30-raw"
    mkdir -p "$raw"
    # Synthetic vocabularies (no vocab files carried): random-id prompts only.
    for m in ${ARCH30_TINY-gpt-oss gemma4 gemma4moe llama3 mistral3}; do
        f="$work/$m-tiny.gguf"
        $T synth-gguf --preset $m-tiny --quant q8_0 --seed 1 --out "$f" 2>>"$out/run.log" \
            || { echo "synth-gguf $m-tiny failed"; continue; }
        greedy_vs_llama "$f" "$m" random "$raw" "$out/arch30-compare.jsonl"
    done
    tar -C "$work" -czf "$out/arch30-raw.tar.gz" arch30-raw
fi

if has mtp35; then
    say mtp35
    # Speculation from the MTP head on the hybrid file: its random head's drafts are
    # all rejected, so decode tok/s against no drafts is the cost of drafting and
    # verifying k tokens a step. MTP35_VARIANTS: which runs, in order.
    write_hybrid_file || exit 1
    p="$root/bench/spec/edit-code.chatml.txt"
    IFS=, read -ra variants <<<"${MTP35_VARIANTS:-off,mtp 3,mtp 1,mtp 2,mtp 4,off}"
    for v in "${variants[@]}"; do
        set -- $v
        args=()
        [ "$1" = mtp ] && args=(--speculation mtp --speculation-k "$2")
        $T bench --gguf "$hf" --device cuda --pp 0 --tg 256 --reps 2 --tg-prompt-file "$p" \
            "${args[@]}" 2>>"$out/run.log" \
            | sed "s/^{/{\"model\":\"qwen35moe-35b-a3b-q3_k-chat\",\"variant\":\"$v\",/" \
            | tee -a "$out/results.jsonl"
    done
fi

if has hybridbench || has hybridbench1 || has hybridbench2; then
    say hybridbench
    [ -f "$root/.gpu-carry/libggml-cuda.so" ] || { echo "no libggml-cuda.so: run the build step first"; exit 1; }
    V="$root/.gpu-carry/vocab"
    [ -f "$V/ggml-vocab-qwen35.gguf" ] && [ -f "$V/templates/Qwen3.5-4B.jinja" ] || {
        echo "no qwen35 vocabulary/template in .gpu-carry/vocab (scripts/gpu/prepare.sh stages them)"; exit 1; }
    mkdir -p "$out/suite"
    write_hybrid_file || exit 1
    engines=tempo9 lx=""
    note="H200, synthetic Qwen3.5-35B-A3B-shape Q3_K (40 layers: 30 gated-DeltaNet + 10 attention, 256 experts, MTP block; random weights; qwen35 vocabulary and Qwen3.5 chat template, thinking off), Tempo9 on ggml's CUDA backend"
    if llama_server_ready; then
        engines=llamacpp,tempo9
        lx="--device CUDA0"
        lver=$(cat "$root/.llama-server/VERSION" 2>/dev/null); [ -n "$lver" ] || lver="llama.cpp b11434"
        note="$note; llama.cpp: llama-server of $lver with the same CUDA backend library, its defaults (all layers on the GPU) and --device CUDA0"
    else
        echo "no llama-server for the GPU: Tempo9 only"
    fi
    H=(python3 "$root/bench/suite/run.py" --engines "$engines" --model qwen35moe-35b --models-dir "$work/models"
       --tempo9 "$T" --tempo9-extra=--device=cuda "--llama-extra=$lx" --out-dir "$out/suite"
       --tag "${HYBRID_TAG:-.h200-hybrid}" --note "$note")
    # HYBRID_VARIANT="FLAGS": also a Tempo9 server with these flags (run.py --tempo9-variant).
    [ -n "${HYBRID_VARIANT:-}" ] && H+=(--tempo9-variant "$HYBRID_VARIANT")
    # hsuite CAP SCENARIO ARGS...: one suite run, its --timeout-s the smaller of CAP and what
    # is left of HYBRID_DEADLINE (seconds since the script started) less 15 s for its own
    # start and the result writing; skipped when under 60 s are left.
    hsuite() {
        local cap=$1 left=$(( ${HYBRID_DEADLINE:-570} - SECONDS - 15 ))
        shift
        [ "$left" -lt "$cap" ] && cap=$left
        if [ "$cap" -lt 60 ]; then
            echo "skipped $1: ${cap} s left of HYBRID_DEADLINE" | tee -a "$out/run.log"; return
        fi
        say "suite $1 (--timeout-s $cap)"
        "${H[@]}" "$@" --timeout-s "$cap" 2>&1 | tail -${HYBRID_TAIL:-25}
    }
    # HYBRID_INTERLEAVE=N: agents as N repetitions on fresh servers of both engines, rounds
    # back to back (run.py --interleave; both 15 GB models on the GPU at once).
    il=(); [ "${HYBRID_INTERLEAVE:-0}" != 0 ] && il=(--interleave "$HYBRID_INTERLEAVE")
    # HYBRID_LOG=1: Tempo9 servers log their steps (TEMPO9_LOG=info,tempo9_engine=debug);
    # the logs come back in $OUT/server-logs.tar.gz.
    [ "${HYBRID_LOG:-0}" != 0 ] && export TEMPO9_LOG=info,tempo9_engine=debug
    if has hybridbench1 || has hybridbench; then
        hsuite 170 agents-1.5k "${il[@]}"
        hsuite 330 agents-10k "${il[@]}"
    fi
    if has hybridbench2 || has hybridbench; then
        hsuite 120 prefix-hit --prefix-sizes 15000
        hsuite 180 startup-memory
        hsuite 150 fill-memory
    fi
    if [ "${HYBRID_LOG:-0}" != 0 ] && ls /tmp/bench-tempo9-*.log >/dev/null 2>&1; then
        tar -C /tmp -czf "$out/server-logs.tar.gz" $(cd /tmp && ls bench-tempo9-*.log)
    fi
fi

if has vision32; then
    say vision32
    vt="$work/qwen3vl-tiny.gguf"; vp="$work/mmproj-qwen3vl-tiny.gguf"
    if [ "${VISION32_PARITY:-1}" != 0 ]; then
        python3 "$root/bench/vision/gpu_vs_cpu.py" --tempo9 "$T" --gguf "$vt" --mmproj "$vp" \
            --config "cpu:--device cpu --vision-device cpu" \
            --config "cuda:--device cuda --vision-device same" \
            --config "cuda-lm-cpu-encoder:--device cuda --vision-device cpu" \
            2>>"$out/run.log" | tee -a "$out/vision32-parity.jsonl"
    fi
    lm="$work/qwen3-vl-30b-a3b-q4_k.gguf"; pj="$work/mmproj-qwen3-vl-30b-a3b-f16.gguf"
    mtmd=()
    if [ "${llama_rc:-1}" = 0 ] && [ -x "${LLAMA_BUILD_DIR:-/tmp/llama-build}/bin/llama-mtmd-cli" ]; then
        mtmd=(--llama-mtmd-cli "${LLAMA_BUILD_DIR:-/tmp/llama-build}/bin/llama-mtmd-cli")
    fi
    # VISION32_VARIANTS picks among: inline stream stream-noprio text cpu llama (llama.cpp's llama-server
    # with the same clients, when .llama-server is carried: it encodes inside its one
    # decoding loop).
    vv=()
    for v in ${VISION32_VARIANTS:-inline stream text cpu llama}; do
        case $v in
            inline) vv+=(--variant "inline:--vision-device same --vision-inline") ;;
            stream) vv+=(--variant "stream:--vision-device same") ;;
            # The decode steps' streams at the default priority (stream-priority.py).
            stream-noprio) vv+=(--variant "stream-noprio:GGML_CUDA_STREAM_PRIORITY=0 --vision-device same") ;;
            text) vv+=(--variant "text:--vision-device same") ;;
            # The encoder on P% of the SMs (a green context, green-ctx.py): greenP.
            green[0-9]*) vv+=(--variant "$v:--vision-device same --vision-sm-share ${v#green}") ;;
            cpu) vv+=(--variant "cpu:--vision-device cpu") ;;
            llama) if llama_server_ready; then
                       vv+=(--llama-server "$LLAMA_CPP_BIN_DIR" --variant "llama:--device CUDA0 -ngl 99 -fa on")
                   else echo "vision32: no llama-server (prepare.sh stages .llama-server)" | tee -a "$out/run.log"; fi ;;
        esac
    done
    python3 "$root/bench/vision/encode_while_decode.py" --tempo9 "$T" --gguf "$lm" --mmproj "$pj" \
        --device cuda --streams 4 --image-every 1 --size "${VISION32_SIZE:-768x768}" \
        --window-s "${VISION32_WINDOW:-15}" --reps "${VISION32_REPS:-1}" --log-dir "$work/vision32-logs" "${mtmd[@]}" \
        "${vv[@]}" 2>>"$out/run.log" | tee -a "$out/vision32.jsonl"
    tar -C "$work" -czf "$out/vision32-logs.tar.gz" vision32-logs
fi

if has sdk34; then
    # The SDK in process on the GPU (issue 34): the bench example (.gpu-carry/sdk-bench.xz,
    # staged by `prepare.sh` with SDK_BENCH=1) decodes through tempo9::Model on CUDA, alone
    # in its process, against `tempo9 bench`'s loop in a process of its own, rounds
    # alternated; its first-token latency against the same request over HTTP from a fresh
    # `tempo9 serve --device cuda`.
    say sdk34
    sb="$root/.gpu-carry/sdk-bench"
    [ -x "$sb" ] || { xz -dc "$sb.xz" >"$sb" && chmod +x "$sb"; }
    f="$work/llama-8b-q4_k.gguf"
    [ -f "$f" ] || $T synth-gguf --arch llama --preset 8b --quant q4_k --unique-mib 4 --out "$f" >>"$out/run.log" 2>&1
    for i in $(seq 1 "${SDK34_ROUNDS:-3}"); do
        $T bench --gguf "$f" --device cuda --pp 0 --tg 128 --reps 3 2>>"$out/run.log" \
            | sed "s/^{/{\"round\":$i,\"run\":\"tempo9-bench\",/" | tee -a "$out/sdk34.jsonl"
        port=$((18900 + i))
        $T serve --gguf "$f" --device cuda --port $port --no-kv-ssd --kv-budget 8G >"$work/sdk34-serve-$i.log" 2>&1 &
        sp=$!
        for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
        "$sb" "$f" --alone --device cuda --tg 128 --reps 4 --http "http://127.0.0.1:$port" 2>>"$out/run.log" \
            | sed "s/^{/{\"round\":$i,\"run\":\"sdk\",/" | tee -a "$out/sdk34.jsonl"
        echo "sdk34 round $i: sdk-bench exit status ${PIPESTATUS[0]}" | tee -a "$out/run.log"
        kill $sp; wait $sp 2>/dev/null
    done
fi

if has vision32g; then
    say vision32g
    gt="$work/gemma4-tiny-vocab.gguf"; gp="$work/mmproj-gemma4-tiny.gguf"
    xz -dc "$root/.gpu-carry/vocab/ggml-vocab-gemma-4.gguf.xz" >"$work/ggml-vocab-gemma-4.gguf"
    $T synth-gguf --preset gemma4-tiny --vocab "$work/ggml-vocab-gemma-4.gguf" \
        --template "$root/.gpu-carry/vocab/templates/google-gemma-4-31B-it.jinja" --quant q8_0 --seed 1 \
        --out "$gt" >>"$out/run.log" 2>&1
    $T synth-gguf --projector gemma4-tiny --out "$gp" >>"$out/run.log" 2>&1
    python3 "$root/bench/vision/gpu_vs_cpu.py" --tempo9 "$T" --gguf "$gt" --mmproj "$gp" \
        --config "cpu:--device cpu --vision-device cpu" \
        --config "cuda:--device cuda --vision-device same" \
        --config "cuda-lm-cpu-encoder:--device cuda --vision-device cpu" \
        --log-dir "$out" 2>>"$out/run.log" | tee -a "$out/vision32-gemma4.jsonl"
fi

if has pack; then
    say pack
    lib="$root/.gpu-carry/libggml-cuda.so"
    (cd "$(dirname "$lib")" && sha256sum libggml-cuda.so) >"$out/libggml-cuda.so.sha256"
    lib_recipe >"$out/libggml-cuda.recipe"
    xz -T0 -3 -c "$lib" | split -b 15M -d - "$out/libggml-cuda.so.xz.part"
    ls -la "$out"
fi
if has bundle; then
    # The device tool returns at most 8 files: everything but the packed library parts
    # goes back in one archive.
    (cd "$out" && find . -type f ! -name 'libggml-cuda.so.*' ! -name bundle.tar.gz -printf '%P\n' \
        | tar -czf bundle.tar.gz -T - --remove-files) && find "$out" -type d -empty -delete
    ls -la "$out"
fi
say done
