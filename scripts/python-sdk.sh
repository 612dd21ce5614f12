#!/usr/bin/env bash
# Builds the Python package (crates/tempo9-py, PyO3) into a wheel with maturin,
# installs it, and runs its tests (crates/tempo9-py/tests, pytest) — the
# `python sdk` step of scripts/test.sh. Self-installing: pip installs maturin and
# pytest. The tests compare with the `tempo9` binary of $CARGO_TARGET_DIR (build it
# first: cargo build --release -p tempo9-cli) on the models of
# scripts/fetch-models.sh. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tempo9/target}"
pkg=crates/tempo9-py
python3 -m pip install -q --disable-pip-version-check "maturin>=1.7,<2" pytest
# The extension finds ggml's shared libraries next to itself (rpath $ORIGIN, from
# .cargo/config.toml): build them, then ship them inside the package.
# PYO3_PYTHON as maturin sets it, so its build reuses this one.
PYO3_PYTHON="$(python3 -c 'import sys; print(sys.executable)')" cargo build --release -p tempo9-py
rm -f "$pkg"/python/tempo9/libggml*
for lib in libggml.so.0 libggml-base.so.0 libggml-cpu.so.0; do
    cp "$CARGO_TARGET_DIR/release/$lib" "$pkg/python/tempo9/"
done
out="$CARGO_TARGET_DIR/wheels"
rm -rf "$out"
# `--compatibility linux`: a wheel for this machine (its CPU features: ggml is built
# for target-cpu=native), not a portable manylinux one.
python3 -m maturin build --release --manifest-path "$pkg/Cargo.toml" --compatibility linux \
    --out "$out" >&2
python3 -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$out"/tempo9-*.whl
# Run from outside the source tree, so `import tempo9` is the installed wheel.
cd /tmp
OMP_WAIT_POLICY=passive TEMPO9_BIN="${TEMPO9_BIN:-$CARGO_TARGET_DIR/release/tempo9}" \
    python3 -m pytest -q "$OLDPWD/$pkg/tests" "$@"
