#!/usr/bin/env python3
"""kill -9 during SSD tier writes, then restart: the persistent tier must come back
(rebuilt page by page from its files), the server must never fail to start, and
answers served from recovered pages must equal the answers before the kill.

Each round: start `tempo9 serve --kv-persist` on one tier directory with a small
`--kv-budget` (so cached prefixes are evicted to the SSD tier and written all the
time), drive prefix-heavy traffic (long distinct documents, several clients), and
SIGKILL the server while the tier has writes pending (or after a few seconds).
Then count the page files left on disk, restart on the same directory, and read
the tier's page count (recovered) from /v1/status: discarded = files - recovered
(partial and damaged files). Finally the same greedy requests run again and must
answer as before the kill (`--deterministic`). Loopback only; bounded by rounds and
per-request timeouts.

    python3 bench/crash/kill9.py --gguf ~/.cache/tempo9/models/smollm2-135m-instruct-q4_1.gguf --rounds 5
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "soak"))
import soak  # noqa: E402

KEY = "kill9-key"


def post_chat(base, doc, q, max_tokens=8, timeout=120):
    body = json.dumps({"model": "soak", "temperature": 0, "max_tokens": max_tokens,
                       "messages": [{"role": "system", "content": "You are terse. " + doc},
                                    {"role": "user", "content": q}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def page_files(kv_dir):
    n, parts = 0, 0
    for root, _, files in os.walk(kv_dir):
        n += sum(f.endswith(".page") for f in files)
        parts += sum(f.endswith(".part") for f in files)
    return n, parts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target"))
    ap.add_argument("--bin", default=os.environ.get("TEMPO9_BIN", os.path.join(target, "release", "tempo9")))
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--kill-after", type=float, default=20, help="seconds of traffic before the kill at most")
    ap.add_argument("--kv-budget", default="24M")
    ap.add_argument("--out")
    a = ap.parse_args()
    kv_dir = tempfile.mkdtemp(prefix="tempo9-kill9-")
    docs = [soak.document(100 + i, 300) for i in range(12)]
    extra = ["--kv-budget", a.kv_budget, "--ctx", "2048", "--threads", "1", "--kv-persist"]
    rounds, reference = [], {}
    failures = []
    try:
        for rnd in range(a.rounds):
            log = os.path.join(tempfile.gettempdir(), "tempo9-kill9-%d-%d.log" % (os.getpid(), rnd))
            t0 = time.time()
            try:
                proc, base, _ = soak.start_server(a.bin, a.gguf, kv_dir, log, extra, KEY)
            except RuntimeError as e:
                failures.append("round %d: the server did not start after the kill: %s" % (rnd, e))
                break
            start_s = time.time() - t0
            st = soak.status_json(base, KEY)
            recovered = st["kv"]["ssd"]["pages"]
            files_before = rounds[-1]["files_after_kill"] if rounds else 0
            parts_before = rounds[-1]["part_files_after_kill"] if rounds else 0
            parts_left = page_files(kv_dir)[1]
            # Answers must equal those before the kill, from recovered pages or not.
            changed = 0
            hit0 = st["kv"]["ssd"]["hit_tokens"]
            for i, doc in enumerate(docs[:4]):
                ans = post_chat(base, doc, "Summarize.")
                if i in reference and reference[i] != ans:
                    changed += 1
                reference.setdefault(i, ans)
            ssd_hits = soak.status_json(base, KEY)["kv"]["ssd"]["hit_tokens"] - hit0
            # Prefix-heavy traffic until the kill.
            stop = threading.Event()
            errors = []

            def client(seed):
                rng = random.Random(seed)
                while not stop.is_set():
                    try:
                        post_chat(base, rng.choice(docs), rng.choice(soak.QUESTIONS), max_tokens=4)
                    except Exception as e:  # noqa: BLE001 - the kill ends requests
                        if not stop.is_set():
                            errors.append(repr(e)[:200])
                        return

            workers = [threading.Thread(target=client, args=(rnd * 100 + i,), daemon=True)
                       for i in range(a.clients)]
            for w in workers:
                w.start()
            deadline = time.time() + a.kill_after
            pending_seen = 0
            while time.time() < deadline:
                try:
                    pending = soak.status_json(base, KEY, timeout=5)["kv"]["ssd"]["pending_pages"]
                except OSError:
                    pending = 0
                if pending > 0 and time.time() > deadline - a.kill_after / 2:
                    pending_seen = pending
                    break
                time.sleep(0.05)
            stop.set()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            for w in workers:
                w.join(timeout=30)
            files, parts = page_files(kv_dir)
            with open(log) as f:
                text = f.read()
            r = {"round": rnd, "start_s": round(start_s, 1), "files_before_start": files_before,
                 "recovered_pages": recovered, "discarded": max(0, files_before - recovered),
                 "partial_writes_removed": parts_before - parts_left,
                 "ssd_hit_tokens_after_restart": ssd_hits, "answers_changed": changed,
                 "pending_pages_at_kill": pending_seen, "files_after_kill": files,
                 "part_files_after_kill": parts, "client_errors_before_kill": len(errors)}
            if "panicked" in text:
                failures.append("round %d: panic in the log" % rnd)
            if changed:
                failures.append("round %d: %d answers changed after the restart" % (rnd, changed))
            if errors:
                failures.append("round %d: requests failed before the kill: %s" % (rnd, errors[:2]))
            rounds.append(r)
            print(json.dumps(r), flush=True)
        # A last clean start and stop: the recovered tier is written back as an index.
        log = os.path.join(tempfile.gettempdir(), "tempo9-kill9-%d-final.log" % os.getpid())
        proc, base, _ = soak.start_server(a.bin, a.gguf, kv_dir, log, extra, KEY)
        final = soak.status_json(base, KEY)["kv"]["ssd"]["pages"]
        proc.terminate()
        rc = proc.wait(timeout=60)
        print(json.dumps({"final_start_pages": final, "clean_stop_status": rc}))
        if rc != 0:
            failures.append("the clean stop exited with %s" % rc)
    finally:
        shutil.rmtree(kv_dir, ignore_errors=True)
    result = {"rounds": rounds, "failures": failures, "command": sys.argv, "load": os.getloadavg()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print("checks: " + ("all passed" if not failures else "FAILED: " + "; ".join(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
