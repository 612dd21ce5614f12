#!/usr/bin/env bash
# The test command: installs build dependencies, fetches the test models, then runs
# every test (release profile: ggml is compiled once, and model tests run fast;
# among them crates/tempo9-c/tests/c_example.rs, which compiles and runs the SDK's C
# example), the Python SDK's wheel and tests (scripts/python-sdk.sh), then the
# end-to-end server tests (tests/e2e: the real `tempo9` server on the real
# small models, driven by the official openai, anthropic and ollama Python clients).
#
# Every part runs to the end even when an earlier one fails; a summary of what
# failed comes last and the exit status is non-zero if anything did.
#
# The parity tests against llama.cpp run on their own with their output shown: the
# log names this build's CPU kernel set and whether parity was exact (a fixture for
# this kernel set exists) or teacher-forced (none does).
#
# TEMPO9_TARGET_CPU=x86-64-v3 (any rustc target-cpu) builds ggml and Tempo9 for that
# instruction set instead of this machine's (`native`), in its own target dir, e.g.
# to run an AVX2 machine's tests on an AVX-512 one.
#
# Caches: models and cargo's target dirs under ~/.cache/tempo9.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
bash scripts/fetch-models.sh all || exit 1
# The larger real model: the speculation tests' draft pair (1.5B drafted by the 0.5B).
bash scripts/fetch-models.sh qwen2.5-coder-1.5b || exit 1

cpu=${TEMPO9_TARGET_CPU:-native}
if [ "$cpu" = native ]; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}"
else
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target-$cpu}"
    # Replaces .cargo/config.toml's flags (target-cpu=native and the rpath).
    export RUSTFLAGS="-C target-cpu=$cpu -C link-arg=-Wl,-rpath,\$ORIGIN"
fi

failed=()
step() { # name command...
    local name=$1
    shift
    echo "=== $name" >&2
    "$@" || failed+=("$name")
}

step "build tempo9" cargo build --release -p tempo9-cli
if [ -x "$CARGO_TARGET_DIR/release/tempo9" ]; then
    echo "CPU kernel set (target-cpu=$cpu): $("$CARGO_TARGET_DIR/release/tempo9" kernels)"
    # The synthetic models the Qwen3-family fixtures were recorded on (sha256-checked).
    step "synthetic test models" python3 scripts/synth-models.py "$CARGO_TARGET_DIR/release/tempo9"
fi
step "cargo test (workspace)" cargo test --release --workspace --no-fail-fast "$@" -- --skip parity_
step "cargo test parity" cargo test --release -p tempo9-engine --test parity --no-fail-fast \
    -- --nocapture --test-threads 1
# The Python SDK: maturin builds the wheel, pip installs it, pytest runs its tests.
step "python sdk (maturin, pytest)" bash scripts/python-sdk.sh
# Idempotent: pip skips what is already installed.
python3 -m pip install -q --disable-pip-version-check openai anthropic ollama pytest httpx jsonschema
if [ -x "$CARGO_TARGET_DIR/release/tempo9" ]; then
    TEMPO9_BIN="$CARGO_TARGET_DIR/release/tempo9" step "e2e (pytest)" python3 -m pytest -q tests/e2e
    # Every command of the manual and README run (or covered by a named test), every relative link resolved.
    TEMPO9_BIN="$CARGO_TARGET_DIR/release/tempo9" step "docs (check-docs.py)" python3 scripts/check-docs.py
else
    failed+=("e2e (pytest): no tempo9 binary")
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED test steps: ${failed[*]}" >&2
    exit 1
fi
echo "all test steps passed (target-cpu=$cpu)" >&2
