#!/usr/bin/env python3
"""Many long-context agents through a small RAM budget (issue 7).

N agents (default 8), each with its own ~H-token history (a distinct header, then
a coding-agent system prompt), take turns: every turn each agent in order sends
its whole conversation plus a new question (greedy, T output tokens) and keeps
the answer. The same workload runs on Tempo9 servers that differ only in where KV
may live:

  unlimited  default RAM budget, no SSD tier (the reference outputs)
  ssd        --kv-budget B plus the SSD tier (evicted prefix pages go to disk)
  nossd      --kv-budget B, no SSD tier (evicted pages are recomputed)

It reports, per configuration: whether every answer equals the unlimited run's,
TTFT and cached tokens per turn, the SSD tier's counters (/metrics), and memory:
RSS right after start-up and peak RSS (VmHWM), against B.

usage: python3 bench/ssd/agents.py [--model smollm2] [--agents 8] [--history-tokens 4000]
                                   [--turns 3] [--kv-budget 128M] [--configs unlimited,ssd,nossd]
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "suite"))
sys.path.insert(0, HERE)

import engines  # noqa: E402
import prompts  # noqa: E402
from client import chat  # noqa: E402
from run import metrics, model_path  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
QUESTIONS = ["Which file would you open first, and why?",
             "Name the test you would run after that change.",
             "Summarize your plan in one sentence."]


def parse_size(s):
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def histories(a):
    base = prompts.system_prompt(a.history_tokens, prompts.cpt(a.model))
    # A distinct first line: no two agents share a single KV page.
    return ["You are agent %d of %d, working on ticket #%d.\n" % (i + 1, a.agents, 4100 + 17 * i) + base
            for i in range(a.agents)]


def workload(srv, model_file, a):
    run = {"memory_start": srv.memory(model_file), "turns": []}
    convs = [[{"role": "system", "content": h}] for h in histories(a)]
    peak = 0
    for t in range(a.turns):
        recs = []
        for i, conv in enumerate(convs):
            conv.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            r = chat(srv.base, conv, max_tokens=a.out_tokens, timeout=1800)
            if not r["ok"]:
                raise SystemExit("%s agent %d turn %d failed: %s" % (srv.name, i, t + 1, r["error"]))
            conv.append({"role": "assistant", "content": r["text"]})
            recs.append({"agent": i, "ttft_s": r["ttft_s"], "prompt_tokens": r["prompt_tokens"],
                         "cached_tokens": r["cached_tokens"], "text": r["text"]})
            peak = max(peak, srv.memory(model_file).get("VmHWM", 0))
        print("  %-12s turn %d: TTFT median %.2f s, prompt %d-%d, cached %d of %d" % (
            srv.name, t + 1, statistics.median(x["ttft_s"] for x in recs),
            min(x["prompt_tokens"] for x in recs), max(x["prompt_tokens"] for x in recs),
            sum(x["cached_tokens"] or 0 for x in recs), sum(x["prompt_tokens"] for x in recs)), flush=True)
        run["turns"].append(recs)
    run["memory_end"] = srv.memory(model_file)
    run["peak_rss"] = max(peak, run["memory_end"].get("VmHWM", 0))
    run["metrics"] = metrics(srv.base)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=sorted(engines.MODELS))
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--history-tokens", type=int, default=4000)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--out-tokens", type=int, default=24)
    ap.add_argument("--kv-budget", default="128M", help="the tight RAM KV budget")
    ap.add_argument("--configs", default="unlimited,ssd,nossd")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--tag", default="")
    ap.add_argument("--tempo9", default=os.path.expanduser("~/.cache/tempo9/target/release/tempo9"))
    a = ap.parse_args()
    model_file = model_path(a.model)
    ssd_dir = tempfile.mkdtemp(prefix="tempo9-ssd-agents-")
    extra = {"unlimited": ["--no-kv-ssd"],
             "ssd": ["--kv-budget", a.kv_budget, "--kv-ssd-dir", ssd_dir],
             "nossd": ["--kv-budget", a.kv_budget, "--no-kv-ssd"]}
    t_start = time.time()
    runs = {}
    try:
        for key in a.configs.split(","):
            eng = engines.Tempo9(a.tempo9, extra=" ".join(extra[key]))
            srv = eng.server(model_file, ctx=a.ctx)
            srv.name = key
            try:
                runs[key] = workload(srv, model_file, a)
                runs[key]["cmd"] = srv.cmd
            finally:
                srv.stop()
    finally:
        shutil.rmtree(ssd_dir, ignore_errors=True)
    ref = runs.get("unlimited")
    budget = parse_size(a.kv_budget)
    rows = []
    for key, r in runs.items():
        same = None
        if ref is not None:
            pairs = [(x["text"], y["text"]) for tr, tu in zip(r["turns"], ref["turns"]) for x, y in zip(tr, tu)]
            same = "%d/%d" % (sum(p == q for p, q in pairs), len(pairs))
        m = r["metrics"]
        start = r["memory_start"].get("VmRSS", 0)
        rows.append({
            "config": key, "same_as_unlimited": same,
            "ttft_median_per_turn_s": [round(statistics.median(x["ttft_s"] for x in t), 3) for t in r["turns"]],
            "cached_tokens_per_turn": [sum(x["cached_tokens"] or 0 for x in t) for t in r["turns"]],
            "prompt_tokens_per_turn": [sum(x["prompt_tokens"] for x in t) for t in r["turns"]],
            "rss_start_mb": round(start / 1e6, 1), "peak_rss_mb": round(r["peak_rss"] / 1e6, 1),
            "peak_growth_mb": round((r["peak_rss"] - start) / 1e6, 1),
            "ssd_hit_tokens": int(m.get("tempo9_kv_ssd_hit_tokens_total", 0)),
            "ssd_written_mib": round(m.get("tempo9_kv_ssd_write_bytes_total", 0) / 2**20, 1),
            "ssd_read_mib": round(m.get("tempo9_kv_ssd_read_bytes_total", 0) / 2**20, 1),
        })
    date = datetime.date.today().isoformat()
    cmd = "python3 bench/ssd/agents.py " + " ".join(sys.argv[1:])
    result = {"scenario": "ssd-agents", "command": cmd, "model": a.model, "agents": a.agents,
              "history_tokens": a.history_tokens, "turns": a.turns, "kv_budget": a.kv_budget,
              "kv_budget_bytes": budget, "wall_s": round(time.time() - t_start, 1),
              "load_avg": os.getloadavg(), "summary": rows, "runs": runs}
    out = os.path.join(REPO, "bench", "results", "%s-ssd-agents%s" % (date, a.tag))
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = ["# %d agents with ~%d-token histories, %d turns, %s; tight KV budget %s" % (
                 a.agents, a.history_tokens, a.turns, a.model, a.kv_budget), "",
             "Command: `%s` (%.0f s; load average at the end %.2f)  " % (cmd, result["wall_s"], result["load_avg"][0]),
             "", "| config | answers equal to unlimited | TTFT median per turn s | cached / prompt tokens per turn | "
             "RSS at start MB | peak RSS MB (growth) | SSD hit tokens | SSD written / read MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %.0f | %.0f (+%.0f) | %d | %.0f / %.0f |" % (
            r["config"], r["same_as_unlimited"] or "-", " / ".join("%.2f" % x for x in r["ttft_median_per_turn_s"]),
            " / ".join("%d of %d" % (c, p) for c, p in zip(r["cached_tokens_per_turn"], r["prompt_tokens_per_turn"])),
            r["rss_start_mb"], r["peak_rss_mb"], r["peak_growth_mb"], r["ssd_hit_tokens"],
            r["ssd_written_mib"], r["ssd_read_mib"]))
    lines += ["", "Tight budget: %.0f MiB of KV for the tight configurations (RSS growth above start-up "
              "includes the compute buffers and the I/O queue besides KV)." % (budget / 2**20)]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("wrote %s.{json,md}" % out)


if __name__ == "__main__":
    main()
