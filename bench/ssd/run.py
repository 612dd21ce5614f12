#!/usr/bin/env python3
"""SSD tier benchmark (issue 7): prefill time of a long shared prefix served from
Tempo9's SSD tier vs recomputed, and llama.cpp on the same workload.

Workload, per engine configuration, on one server (streamed chat completions,
temperature 0, 8 output tokens, through bench/suite's client):

  1. cold:     system prefix P (~--prefix-tokens) + question 1      (computes P)
  2. fillers:  --fillers requests with other ~P-sized system prompts (push P out
               of a tight RAM budget / out of llama.cpp's single slot)
  3. evicted:  P + question 2   -> Tempo9: P read back from the SSD tier
                                   (or recomputed with --no-kv-ssd);
                                   llama.cpp: its host-RAM prompt cache (--cache-ram)
  4. restart:  the server is stopped and started again, then P + question 3
               -> Tempo9 --kv-persist: P from the persisted SSD tier; others recompute

Configurations: Tempo9 with a tight --kv-budget and the SSD tier (--kv-persist),
Tempo9 with the same budget and --no-kv-ssd (recompute), Tempo9 with the default
(large) RAM budget and no SSD tier (RAM prefix cache), llama.cpp with its defaults
(-np 1, host prompt cache on). Reports client TTFT, llama.cpp's prompt_ms, cached
tokens, Tempo9's SSD counters from /metrics and each server's RSS.

usage: python3 bench/ssd/run.py [--model smollm2] [--prefix-tokens 4000] [--fillers 2]
                                [--filler-tokens N] [--kv-budget 200M] [--engines tempo9,llamacpp]
                                [--configs ssd,nossd,ram] [--tag .NAME]

A 15K prefix (Qwen2.5-Coder, 32K context) costs ~200 s per cold prefill on 2 cores:
there, `--filler-tokens 4000 --configs ssd` keeps a run near 15 minutes (the
restart step is then the prefix served wholly from the SSD tier, and "recomputed"
is the cold step; llama.cpp recomputes on restart).
"""

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "suite"))

import engines  # noqa: E402
import prompts  # noqa: E402
from client import chat  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
QUESTIONS = ["Summarize the project layout in one sentence.",
             "Which tool would you call first to find the failing test?",
             "Name one risk of changing the public API."]


def model_path(key):
    """The GGUF file of a bench model key (`engines.MODELS`), under ~/.cache/tempo9/models."""
    path = engines.MODELS[key]
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~/.cache/tempo9/models"), path)


def metrics(base):
    """Tempo9's KV tier counters from /metrics (name -> value)."""
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("tempo9_kv_") or line.startswith("tempo9_prefix_hit_tokens"):
            k, v = line.split()
            out[k] = float(v)
    return out


def ask(srv, sys_text, q, label):
    t0 = time.perf_counter()
    r = chat(srv.base, [{"role": "system", "content": sys_text}, {"role": "user", "content": q}], max_tokens=8)
    rec = {"step": label, "ttft_s": r["ttft_s"], "total_s": round(time.perf_counter() - t0, 3),
           "prompt_tokens": r["prompt_tokens"], "cached_tokens": r["cached_tokens"], "ok": r["ok"],
           "error": r["error"], "text": r["text"][:80]}
    t = r.get("timings") or {}
    if t:
        rec["server_prompt_ms"] = t.get("prompt_ms")
        rec["server_cache_n"] = t.get("cache_n")
    print("  %-22s %-8s TTFT %6.2f s  prompt %s cached %s" % (
        srv.name, label, r["ttft_s"] or -1, r["prompt_tokens"], r["cached_tokens"]), flush=True)
    return rec


def workload(start, model_file, a, name):
    p = prompts.system_prompt(a.prefix_tokens, prompts.cpt(a.model))
    n_fill = a.filler_tokens or a.prefix_tokens
    fillers = ["Session %d of another team.\n" % (i + 1) + prompts.system_prompt(n_fill, prompts.cpt(a.model))
               for i in range(a.fillers)]
    run = {"config": name, "requests": []}
    srv = start()
    srv.name = name
    run["cmd"] = srv.cmd
    try:
        run["requests"].append(ask(srv, p, QUESTIONS[0], "cold"))
        for i, f in enumerate(fillers):
            run["requests"].append(ask(srv, f, QUESTIONS[0], "filler%d" % (i + 1)))
        run["requests"].append(ask(srv, p, QUESTIONS[1], "evicted"))
        run["metrics_before_restart"] = metrics(srv.base)
        run["memory_before_restart"] = srv.memory(model_file)
    finally:
        srv.stop()
    srv = start()
    srv.name = name
    try:
        run["requests"].append(ask(srv, p, QUESTIONS[2], "restart"))
        run["metrics_after_restart"] = metrics(srv.base)
        run["memory_after_restart"] = srv.memory(model_file)
    finally:
        srv.stop()
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=sorted(engines.MODELS))
    ap.add_argument("--prefix-tokens", type=int, default=4000)
    ap.add_argument("--fillers", type=int, default=2)
    ap.add_argument("--filler-tokens", type=int, default=0, help="filler prompt size (default: --prefix-tokens)")
    ap.add_argument("--kv-budget", default="200M", help="Tempo9's tight RAM KV budget")
    ap.add_argument("--configs", default="ssd,nossd,ram",
                    help="Tempo9 configurations: ssd (tight budget + SSD tier), nossd (tight budget, "
                         "recompute), ram (default budget)")
    ap.add_argument("--tag", default="", help="suffix of the result files (e.g. .15k)")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--engines", default="tempo9,llamacpp")
    ap.add_argument("--tempo9", default=os.path.expanduser("~/.cache/tempo9/target/release/tempo9"))
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    model_file = model_path(a.model)
    names = a.engines.split(",")
    ssd_dir = tempfile.mkdtemp(prefix="tempo9-ssd-bench-")
    t_start = time.time()
    runs = []
    try:
        if "tempo9" in names:
            configs = {
                "ssd": ("tempo9 SSD tier", ["--kv-budget", a.kv_budget, "--kv-ssd-dir", ssd_dir, "--kv-persist"]),
                "nossd": ("tempo9 no SSD", ["--kv-budget", a.kv_budget, "--no-kv-ssd"]),
                "ram": ("tempo9 RAM (default)", ["--no-kv-ssd"]),
            }
            for key in a.configs.split(","):
                name, extra = configs[key]
                eng = engines.Tempo9(a.tempo9, extra=" ".join(extra))
                print(name, flush=True)
                runs.append(workload(lambda: eng.server(model_file, ctx=a.ctx), model_file, a, name))
        if "llamacpp" in names:
            eng = engines.LlamaCpp()
            print("llama.cpp", flush=True)
            runs.append(workload(lambda: eng.server(model_file, ctx=a.ctx, parallel=1), model_file, a,
                                 "llama.cpp (-np 1, cache-ram)"))
    finally:
        shutil.rmtree(ssd_dir, ignore_errors=True)
    date = datetime.date.today().isoformat()
    result = {"scenario": "ssd-tier", "command": "python3 bench/ssd/run.py " + " ".join(sys.argv[1:]),
              "model": a.model, "prefix_tokens": a.prefix_tokens, "fillers": a.fillers,
              "filler_tokens": a.filler_tokens or a.prefix_tokens, "kv_budget": a.kv_budget, "ctx": a.ctx,
              "note": a.note, "wall_s": round(time.time() - t_start, 1), "load_avg": os.getloadavg(), "runs": runs}
    out = os.path.join(REPO, "bench", "results", "%s-ssd-tier%s" % (date, a.tag))
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = ["# SSD tier: %d-token prefix, %s; %d filler(s) of %d tokens; Tempo9 KV budget %s" % (
                 a.prefix_tokens, a.model, a.fillers, a.filler_tokens or a.prefix_tokens, a.kv_budget), "",
             "Command: `%s`  " % result["command"], "Load average at the end: %s  " % (result["load_avg"],),
             "Note: %s" % a.note if a.note else "", "",
             "| config | step | TTFT s | server prompt s | prompt tokens | cached tokens |", "|---|---|---|---|---|---|"]
    for r in runs:
        for q in r["requests"]:
            pms = q.get("server_prompt_ms")
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                r["config"], q["step"], "%.2f" % q["ttft_s"] if q["ttft_s"] else "-",
                "%.2f" % (pms / 1000) if pms else "-", q["prompt_tokens"], q["cached_tokens"]))
    lines += ["", "| config | RSS / peak RSS MB before restart | SSD hit tokens | SSD read MiB | SSD read MB/s | "
              "SSD written MiB | SSD write MB/s |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r.get("metrics_before_restart") or {}
        m2 = r.get("metrics_after_restart") or {}
        mem = r.get("memory_before_restart") or {}

        def rate(b, s):
            return "%.0f" % (b / s / 1e6) if s else "-"
        rb = m.get("tempo9_kv_ssd_read_bytes_total", 0) + m2.get("tempo9_kv_ssd_read_bytes_total", 0)
        rs = m.get("tempo9_kv_ssd_read_seconds_total", 0) + m2.get("tempo9_kv_ssd_read_seconds_total", 0)
        wb = m.get("tempo9_kv_ssd_write_bytes_total", 0)
        ws = m.get("tempo9_kv_ssd_write_seconds_total", 0)
        hits = m.get("tempo9_kv_ssd_hit_tokens_total", 0) + m2.get("tempo9_kv_ssd_hit_tokens_total", 0)
        rss = "%.0f / %.0f" % (mem.get("VmRSS", 0) / 1e6, mem.get("VmHWM", 0) / 1e6)
        lines.append("| %s | %s | %d | %.1f | %s | %.1f | %s |" % (
            r["config"], rss, hits, rb / 2**20, rate(rb, rs), wb / 2**20, rate(wb, ws)))
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("wrote %s.{json,md}" % out)


if __name__ == "__main__":
    main()
