#!/usr/bin/env python3
"""Greedy generations of Tempo9 and llama.cpp, side by side, on the same prompts.

  greedy-compare.py prompts DUMP            prompts of a `check-device --dump` file,
                                            one per line (ids), for llama-greedy
  greedy-compare.py compare DUMP NAME=FILE  pairs of generations: Tempo9's (from the
                                            dump) and llama-greedy's JSON lines

Per pair: prompts whose tokens are all identical, how many of the others part where
either side's top two were within --tie nats, the median step of the first
difference, and the largest top-1 log-probability difference over common prefixes
(the same measures as check-device).
"""
import argparse
import json
import statistics


def compare(want, got, tie):
    if len(want) != len(got):
        raise SystemExit(f"{len(want)} vs {len(got)} generations: a run failed")
    same, ties, firsts, max_dlp = 0, 0, [], 0.0
    for w, g in zip(want, got):
        n = 0
        while n < min(len(w["tokens"]), len(g["tokens"])) and w["tokens"][n] == g["tokens"][n]:
            n += 1
        for k in range(n):
            max_dlp = max(max_dlp, abs(w["top"][k][0][1] - g["top"][k][0][1]))
        if n == len(w["tokens"]) == len(g["tokens"]):
            same += 1
            continue
        firsts.append(n)
        margins = [o["top"][n][0][1] - o["top"][n][1][1] for o in (w, g) if n < len(o["top"])]
        ties += any(m < tie for m in margins)
    return {
        "identical": same,
        "of": len(want),
        "diverged_at_near_tie": ties,
        "first_diff_median": statistics.median(firsts) if firsts else None,
        "max_top1_logprob_diff_common_prefix": round(max_dlp, 4),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["prompts", "compare"])
    ap.add_argument("dump")
    ap.add_argument("others", nargs="*", help="NAME=FILE (llama-greedy output)")
    ap.add_argument("--tie", type=float, default=0.05)
    a = ap.parse_args()
    d = json.load(open(a.dump))
    if a.mode == "prompts":
        for p in d["prompts"]:
            print(" ".join(map(str, p)))
        return
    gens = {k: v for k, v in d.items() if k.startswith("tempo9_")}
    for o in a.others:
        name, path = o.split("=", 1)
        gens[name] = [json.loads(line) for line in open(path) if line.strip()]
    names = list(gens)
    rows = []
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            r = compare(gens[x], gens[y], a.tie)
            rows.append({"a": x, "b": y, **r})
            print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
