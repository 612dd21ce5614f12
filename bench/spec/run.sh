#!/usr/bin/env bash
# Speculative decoding (n-gram drafts) against plain decoding, single stream, on a
# task whose answer re-emits its prompt (edit-code.chatml.txt: rename a function in a
# file and reply with the whole file): decode tok/s of 256 greedy tokens with
# --speculation-k 0 (off) and each K in $KS, alternated, $REPS rounds; medians and the
# ratio to off. JSON lines on stdout (one per run), a table on stderr.
#
# Usage: bench/spec/run.sh MODEL.gguf [extra tempo9 flags...]
#   TEMPO9 (binary, default ~/.cache/tempo9/target/release/tempo9), KS (default "2 4"),
#   REPS (default 3), TG (default 256).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
T=${TEMPO9:-$HOME/.cache/tempo9/target/release/tempo9}
m=$1
shift
ks=${KS:-2 4}
out=$(mktemp)
for r in $(seq "${REPS:-3}"); do
    for k in 0 $ks; do
        "$T" bench --gguf "$m" --pp 0 --tg "${TG:-256}" --reps 1 --speculation-k "$k" \
            --tg-prompt-file "$here/edit-code.chatml.txt" "$@" 2>/dev/null \
            | sed "s/^{/{\"speculation_k\":$k,\"round\":$r,/" | tee -a "$out"
    done
done
python3 - "$out" <<'PY' >&2
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["speculation_k"], []).append(r)
base = statistics.median(x["tg"]["tok_s"][0] for x in by[0])
print(f"{'k':>3} {'tok/s (median)':>15} {'vs off':>7} {'accepted/drafted':>17}")
for k, xs in sorted(by.items()):
    med = statistics.median(x["tg"]["tok_s"][0] for x in xs)
    d = sum(x["tg"]["drafts"][0]["drafted"] for x in xs)
    a = sum(x["tg"]["drafts"][0]["accepted"] for x in xs)
    print(f"{k:>3} {med:>15.1f} {med / base:>7.2f} {a:>8}/{d:<8}")
PY
rm -f "$out"
