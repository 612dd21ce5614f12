#!/usr/bin/env bash
# Set up and run: installs build dependencies, builds Tempo9 (release), fetches the
# default model (SmolLM2-135M-Instruct) and starts a chat with it.
# Extra arguments go to `tempo9 run` (e.g. a prompt: scripts/up.sh "Write a haiku").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/fetch-models.sh smollm2
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}"
cargo build --release -p tempo9
exec "$CARGO_TARGET_DIR/release/tempo9" run \
  --gguf "${TEMPO9_MODELS:-$HOME/.cache/tempo9/models}/smollm2-135m-instruct-q4_1.gguf" "$@"
