#!/usr/bin/env bash
# Set up and serve: installs build dependencies, builds Tempo9 (release), fetches the
# default model (SmolLM2-135M-Instruct) and serves it on http://127.0.0.1:11435
# (OpenAI, Anthropic and Ollama APIs). Extra arguments go to `tempo9 serve`
# (e.g. `scripts/up.sh --port 8080 --api-key secret`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/fetch-models.sh smollm2
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}"
cargo build --release -p tempo9-cli
exec "$CARGO_TARGET_DIR/release/tempo9" serve \
  --gguf "${TEMPO9_MODELS:-$HOME/.cache/tempo9/models}/smollm2-135m-instruct-q4_1.gguf" "$@"
