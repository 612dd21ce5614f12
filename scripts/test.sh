#!/usr/bin/env bash
# The test command: installs build dependencies, fetches the test models, then runs
# every test (release profile: ggml is compiled once, and model tests run fast),
# then the end-to-end server tests (tests/e2e: the real `tempo9` server on the real
# small models, driven by the official openai, anthropic and ollama Python clients).
# Caches: models and cargo's target dir under ~/.cache/tempo9.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/fetch-models.sh all
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}"
cargo test --release --workspace "$@"
cargo build --release -p tempo9
# Idempotent: pip skips what is already installed.
python3 -m pip install -q --disable-pip-version-check openai anthropic ollama pytest httpx jsonschema
TEMPO9_BIN="$CARGO_TARGET_DIR/release/tempo9" python3 -m pytest -q tests/e2e
