#!/usr/bin/env python3
"""Overload: clients at 2x and 10x the server's capacity, and memory pressure.

Capacity here is `--max-concurrent` (generation requests in flight). Each phase
starts its own `tempo9 serve` on loopback and runs N closed-loop clients (each sends
its next request when the last one is answered) for T seconds, half OpenAI chat and
half Anthropic messages, and records every answer's status code (200, 429, 529,
anything else) and latency, and whether refusals carry `Retry-After`.

Phases:
- `2x`, `10x`: `--max-concurrent C --max-waiting C` with 2C and 10C clients.
- `tokens`: the same 2C clients against `--max-total-tokens` (the server-wide token
  limit) instead of the concurrency cap.
- `memory`: a tiny `--kv-budget` and 16 clients with long prompts that do not fit
  together: eviction, SSD offload and preemption must absorb it; no 5xx, the server
  alive at the end (no OOM kill), RSS recorded.

    python3 bench/overload/overload.py --gguf ~/.cache/tempo9/models/smollm2-135m-instruct-q4_1.gguf
"""

import argparse
import http.client
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "soak"))
import soak  # noqa: E402

KEY = "overload-key"


def request(port, rng, long_prompt, max_tokens):
    anthropic = rng.random() < 0.5
    system = "You are terse. " + (rng.choice(soak.DOCS) if long_prompt else "")
    msgs = [{"role": "user", "content": rng.choice(soak.QUESTIONS)}]
    if anthropic:
        path, body = "/v1/messages", {"model": "soak", "max_tokens": max_tokens, "system": system,
                                      "messages": msgs, "temperature": 0}
    else:
        path, body = "/v1/chat/completions", {"model": "soak", "max_tokens": max_tokens, "temperature": 0,
                                              "messages": [{"role": "system", "content": system}] + msgs}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t = time.time()
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
        r = conn.getresponse()
        r.read()
        return ("anthropic" if anthropic else "openai", r.status, time.time() - t,
                r.getheader("Retry-After") is not None)
    except OSError as e:
        return ("anthropic" if anthropic else "openai", "error: " + type(e).__name__, time.time() - t, False)
    finally:
        conn.close()


def phase(a, name, clients, seconds, extra, long_prompt=False, max_tokens=8):
    kv_dir = tempfile.mkdtemp(prefix="tempo9-overload-")
    log = os.path.join(tempfile.gettempdir(), "tempo9-overload-%s-%d.log" % (name, os.getpid()))
    proc, base, cmd = soak.start_server(a.bin, a.gguf, kv_dir, log, ["--threads", "1", *extra], KEY)
    port = int(base.rsplit(":", 1)[1])
    results, lock = [], threading.Lock()
    sampler = soak.Sampler(base, KEY, proc.pid)
    sampler.start()
    deadline = time.time() + seconds

    def client(i):
        rng = random.Random(i)
        while time.time() < deadline:
            r = request(port, rng, long_prompt, max_tokens)
            with lock:
                results.append(r)
            if r[1] in (429, 529):
                time.sleep(0.2)  # a polite client backs off a little

    ws = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for w in ws:
        w.start()
    for w in ws:
        w.join(timeout=seconds + 330)
    sampler.stop.set()
    sampler.join(timeout=5)
    alive = proc.poll() is None
    end = soak.status_json(base, KEY) if alive else None
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except Exception:  # noqa: BLE001
        proc.kill()
    shutil.rmtree(kv_dir, ignore_errors=True)
    by_status = {}
    for api, status, secs, retry in results:
        d = by_status.setdefault("%s %s" % (api, status), {"n": 0, "secs": [], "retry_after": 0})
        d["n"] += 1
        d["secs"].append(secs)
        d["retry_after"] += retry
    summary = {k: {"n": d["n"], "p50_s": round(soak.percentile(d["secs"], 0.5), 3),
                   "p99_s": round(soak.percentile(d["secs"], 0.99), 3), "retry_after": d["retry_after"]}
               for k, d in sorted(by_status.items())}
    rss = [s["rss_kib"] for s in sampler.samples if s.get("rss_kib")]
    out = {"phase": name, "clients": clients, "seconds": seconds, "command": cmd, "alive_at_end": alive,
           "by_status": summary, "rss_mib_peak": round(max(rss) / 1024) if rss else None,
           "peak_waiting": max((s.get("waiting", 0) for s in sampler.samples), default=0),
           "peak_running": max((s.get("running", 0) for s in sampler.samples), default=0)}
    if end:
        out.update(preemptions=end["totals"]["preemptions"], evicted_pages=end["totals"]["evicted_pages"],
                   ssd_pages_written=end["kv"]["ssd"]["pages"], pages_total=end["kv"]["ram"]["total"])
    with open(log) as f:
        if "panicked" in f.read():
            out["panic"] = True
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target"))
    ap.add_argument("--bin", default=os.environ.get("TEMPO9_BIN", os.path.join(target, "release", "tempo9")))
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--capacity", type=int, default=4, help="--max-concurrent (and --max-waiting)")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--phases", default="2x,10x,tokens,memory")
    ap.add_argument("--out")
    a = ap.parse_args()
    c = a.capacity
    cap = ["--max-concurrent", str(c), "--max-waiting", str(c), "--kv-budget", "128M", "--ctx", "4096"]
    phases = {
        "2x": lambda: phase(a, "2x", 2 * c, a.seconds, cap),
        "10x": lambda: phase(a, "10x", 10 * c, a.seconds, cap),
        # About C short requests' worth of tokens (prompt ~40 + 8 output each).
        "tokens": lambda: phase(a, "tokens", 2 * c, a.seconds,
                                ["--max-total-tokens", str(48 * c), "--kv-budget", "128M", "--ctx", "4096"]),
        # 16 long prompts (~350 tokens, 6 pages each) against 20 pages of KV.
        "memory": lambda: phase(a, "memory", 16, a.seconds, ["--kv-budget", "30M", "--ctx", "1024"],
                                long_prompt=True, max_tokens=16),
    }
    results, failures = [], []
    for name in a.phases.split(","):
        r = phases[name]()
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "command"}), flush=True)
        bad = {k: v["n"] for k, v in r["by_status"].items()
               if not k.endswith((" 200", " 429", " 529"))}
        if bad:
            failures.append("%s: unexpected answers %s" % (name, bad))
        if not r["alive_at_end"] or r.get("panic"):
            failures.append("%s: the server died or panicked" % name)
        refused = sum(v["n"] for k, v in r["by_status"].items() if k.endswith((" 429", " 529")))
        with_retry = sum(v["retry_after"] for k, v in r["by_status"].items() if k.endswith((" 429", " 529")))
        if refused != with_retry:
            failures.append("%s: %d refusals without Retry-After" % (name, refused - with_retry))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"results": results, "failures": failures, "load": os.getloadavg()}, f, indent=1)
    print("checks: " + ("all passed" if not failures else "FAILED: " + "; ".join(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
