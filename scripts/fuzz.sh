#!/usr/bin/env bash
# Fuzzes every target of crates/fuzz-targets with libFuzzer (cargo-fuzz, nightly)
# for N seconds each, one after the other:
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET (60)] [TARGET...]   (default: all of fuzz/fuzz_targets)
#
# Each run starts from the committed seeds (fuzz/corpus/<target>/, read only) and
# keeps what it finds in a scratch corpus ($TEMPO9_FUZZ_WORK, default
# ~/.cache/tempo9/fuzz/<target>); crashes land in fuzz/artifacts/<target>/. Copy an
# input worth keeping into fuzz/corpus/<target>/ and the stable seeded run
# (cargo test -p tempo9-fuzz-targets --test seeded) replays it in every test run.
# A summary line per target: executions, exec/s, coverage, corpus size, crashes.
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Builds into
# ~/.cache/tempo9/target-fuzz. No sanitizer (ggml's C++ libraries are not built for
# one): panics, aborts, stack overflows, timeouts (-timeout) and memory over
# -rss_limit_mb are what is caught.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz on nightly is needed: rustup toolchain install nightly && cargo install cargo-fuzz" >&2
    exit 1
fi
export CARGO_TARGET_DIR="${TEMPO9_FUZZ_TARGET_DIR:-$HOME/.cache/tempo9/target-fuzz}"
work=${TEMPO9_FUZZ_WORK:-$HOME/.cache/tempo9/fuzz}
# The ggml shared libraries sit next to the fuzz binaries' build directory.
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
export LD_LIBRARY_PATH="$CARGO_TARGET_DIR/$triple/release:$CARGO_TARGET_DIR/release:${LD_LIBRARY_PATH:-}"

(cd fuzz && cargo +nightly fuzz build --sanitizer none --release --debug-assertions) || exit 1
summary=()
status=0
for t in "${targets[@]}"; do
    mkdir -p "$work/$t" "fuzz/artifacts/$t"
    log="$work/$t.log"
    echo "=== $t: $secs s" >&2
    (cd fuzz && cargo +nightly fuzz run --sanitizer none --release --debug-assertions "$t" \
        "$work/$t" "corpus/$t" -- -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/") >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    corpus=$(find "$work/$t" -type f | wc -l)
    crashes=$(find "fuzz/artifacts/$t" -type f | wc -l)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    # libFuzzer's last status line: cov (edges), ft (features), corp (units/bytes).
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+')
    line="$t: ${execs:-?} executions in ${secs} s (${rate:-?}/s), ${last:-?}, scratch corpus $corpus inputs, $crashes crash files, exit $rc"
    summary+=("$line")
    echo "$line" >&2
    if [ $rc -ne 0 ]; then
        status=1
        grep -m5 -E "panicked|ERROR|SUMMARY|Test unit written" "$log" >&2
    fi
done
printf '%s\n' "${summary[@]}"
exit $status
