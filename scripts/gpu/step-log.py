#!/usr/bin/env python3
"""Median split of the engine's steady decode steps from a `TEMPO9_LOG=...,tempo9_engine=debug` log.

    python3 scripts/gpu/step-log.py LOG [N_SEQUENCES]

Takes the `step` lines whose step computed one token per sequence for N_SEQUENCES
sequences (default: the most common such count) and prints how many there were and
the median plan / assemble / forward / sample / whole-step milliseconds.
"""
import re
import statistics
import sys
from collections import Counter

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FIELD = re.compile(r"(\w+)=([0-9.]+(?:e-?[0-9]+)?)")


def main():
    steps = []
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            line = ANSI.sub("", line)
            if " step " not in line or "tokens=" not in line:
                continue
            d = {k: float(v) for k, v in FIELD.findall(line)}
            if "step_ms" in d and d.get("tokens") == d.get("sequences"):
                steps.append(d)
    if not steps:
        print("no decode step lines")
        return
    want = int(sys.argv[2]) if len(sys.argv) > 2 else Counter(d["sequences"] for d in steps).most_common(1)[0][0]
    sel = [d for d in steps if d["sequences"] == want]
    print("decode steps of %d sequences: %d" % (want, len(sel)))
    for k in ("plan_ms", "assemble_ms", "forward_ms", "sample_ms", "step_ms"):
        xs = [d[k] for d in sel if k in d]
        if xs:
            print("  %-12s median %8.3f  min %8.3f  max %8.3f" % (k, statistics.median(xs), min(xs), max(xs)))


if __name__ == "__main__":
    main()
