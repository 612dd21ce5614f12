#!/usr/bin/env bash
# The test command: installs build dependencies, fetches the test models, then runs
# every test (release profile: ggml is compiled once, and model tests run fast).
# Caches: models and cargo's target dir under ~/.cache/tempo9.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/fetch-models.sh all
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}"
cargo test --release --workspace "$@"
