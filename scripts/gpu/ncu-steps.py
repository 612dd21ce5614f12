#!/usr/bin/env python3
"""Per-step GPU kernel time from an Nsight Compute CSV (run-h200.sh's `ncu` step).

    python3 scripts/gpu/ncu-steps.py [--json] ncu-tempo9.csv [ncu-llama.csv ...]
    python3 scripts/gpu/ncu-steps.py --by-step ncu64-tempo9.csv

Takes the kernels in launch order, finds the decode step as the shortest period P
with which the last 2P kernel names repeat, and prints for the last step: kernels,
summed kernel time (no launch gaps), DRAM bytes read+written and their rate, and a
table per kernel name. With --json prints the same as one JSON object per file.
With --by-step: Tempo9's greedy steps end in an argmax kernel; prints every whole
step between two of them (rows from the rms_norm grid, kernel time per name).
With --sum: every kernel of each file summed per name (a prompt step, where no step
repeats), the files side by side.
"""
import csv
import json
import sys
from collections import OrderedDict


def load(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    kern = OrderedDict()
    for r in csv.DictReader(lines):
        k = kern.setdefault(r["ID"], {"name": r["Kernel Name"], "grid": r.get("Grid Size", ""),
                                     "block": r.get("Block Size", "")})
        v = r["Metric Value"].replace(",", "")
        try:
            k[r["Metric Name"]] = float(v)
        except ValueError:
            pass
    rows = list(kern.values())
    return rows


def period(names, lo=20):
    for p in range(lo, len(names) // 2 + 1):
        if names[-p:] == names[-2 * p:-p]:
            return p
    return None


def summarize(path):
    ks = load(path)
    names = [k["name"] for k in ks]
    p = period(names)
    if p is None:
        return {"file": path, "kernels": len(ks), "error": "no repeating step found"}
    step = ks[-p:]
    t = sum(k.get("gpu__time_duration.sum", 0) for k in step)
    rd = sum(k.get("dram__bytes_read.sum", 0) for k in step)
    wr = sum(k.get("dram__bytes_write.sum", 0) for k in step)
    by = OrderedDict()
    for k in step:
        g = by.setdefault(k["name"], {"n": 0, "ns": 0.0, "bytes": 0.0})
        g["n"] += 1
        g["ns"] += k.get("gpu__time_duration.sum", 0)
        g["bytes"] += k.get("dram__bytes_read.sum", 0) + k.get("dram__bytes_write.sum", 0)
    groups = sorted(by.items(), key=lambda x: -x[1]["ns"])
    return {
        "file": path,
        "kernels_profiled": len(ks),
        "kernels_per_step": p,
        "kernel_us_per_step": t / 1e3,
        "dram_gb_per_step": (rd + wr) / 1e9,
        "dram_read_gb_per_step": rd / 1e9,
        "dram_tb_s_over_kernel_time": (rd + wr) / t / 1e3 if t else None,
        "by_kernel": [
            {"name": n, "count": g["n"], "us": round(g["ns"] / 1e3, 1),
             "gb": round(g["bytes"] / 1e9, 4),
             "tb_s": round(g["bytes"] / g["ns"] / 1e3, 3) if g["ns"] else None}
            for n, g in groups
        ],
    }


def by_step(path):
    ks = load(path)
    ends = [i for i, k in enumerate(ks) if k["name"].startswith("argmax")]
    print(f"== {path}: {len(ks)} kernels, {max(len(ends) - 1, 0)} whole steps")
    for a, b in zip(ends, ends[1:]):
        step = ks[a + 1:b + 1]
        by = OrderedDict()
        for k in step:
            g = by.setdefault(k["name"], [0, 0.0])
            g[0] += 1
            g[1] += k.get("gpu__time_duration.sum", 0)
        rows = sorted({k["grid"] for k in step if k["name"].startswith("rms_norm")})
        total = sum(g[1] for g in by.values())
        print(f"-- step: {len(step)} kernels, kernel time {total / 1e3:.0f} us, rms_norm grids {rows}")
        for n, (c, ns) in sorted(by.items(), key=lambda x: -x[1][1]):
            print(f"{ns / 1e3:9.1f} us {c:5d} {100 * ns / total:5.1f} %  {n[:80]}")


def sums(paths):
    tables = []
    for path in paths:
        by = OrderedDict()
        for k in load(path):
            g = by.setdefault(k["name"], [0, 0.0])
            g[0] += 1
            g[1] += k.get("gpu__time_duration.sum", 0)
        total = sum(g[1] for g in by.values())
        tables.append((path, total, by))
        print(f"== {path}: {sum(g[0] for g in by.values())} kernels, {total / 1e3:.0f} us")
    names = sorted({n for _, _, by in tables for n in by},
                   key=lambda n: -max(by.get(n, [0, 0.0])[1] for _, _, by in tables))
    print(" | ".join(f"{'us':>9} {'n':>5}" for _ in tables) + "  kernel")
    for n in names[:40]:
        cells = [by.get(n, [0, 0.0]) for _, _, by in tables]
        print(" | ".join(f"{ns / 1e3:9.1f} {c:5d}" for c, ns in cells) + f"  {n[:90]}")


def main():
    if "--sum" in sys.argv:
        sums([a for a in sys.argv[1:] if a != "--sum"])
        return
    if "--by-step" in sys.argv:
        for path in [a for a in sys.argv[1:] if a != "--by-step"]:
            by_step(path)
        return
    args = [a for a in sys.argv[1:] if a != "--json"]
    for path in args:
        s = summarize(path)
        if "--json" in sys.argv:
            print(json.dumps(s))
            continue
        print(f"== {path}")
        if "error" in s:
            print(s["error"], s["kernels"])
            continue
        print(f"kernels/step {s['kernels_per_step']}, kernel time {s['kernel_us_per_step']:.0f} us, "
              f"DRAM {s['dram_gb_per_step']:.3f} GB -> {s['dram_tb_s_over_kernel_time']:.2f} TB/s")
        print(f"{'us':>8} {'n':>4} {'GB':>7} {'TB/s':>6}  kernel")
        for g in s["by_kernel"][:25]:
            print(f"{g['us']:8.1f} {g['count']:4d} {g['gb']:7.3f} {g['tb_s'] or 0:6.2f}  {g['name'][:90]}")


if __name__ == "__main__":
    main()
