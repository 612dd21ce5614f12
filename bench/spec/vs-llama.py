#!/usr/bin/env python3
"""Speculative decoding, Tempo9 against llama.cpp, single stream, through each server.

For each engine and configuration (off, and each draft depth k in KS with the
chosen mode), starts the server on the same model file, sends one warm-up request
and then the benchmark prompt (bench/spec/edit-code.chatml.txt by default: an agent's
edit whose answer re-emits its prompt) as a streamed greedy /v1/completions request
of TG tokens, and measures decode tok/s at the client: tokens after the first over
the time after the first. A .json prompt file (bench/spec/tool-json.json) holds chat
messages and tools instead: the request is a streamed chat completion with
tool_choice required, and the answer is the tool call's arguments, decoded under
each engine's own tool-call grammar (so the two engines' texts may differ; each is
compared with its own run without drafts). Its rate is all tokens over the whole
request, whose prompt a one-token warm-up request put in each engine's cache: a
tool call may be streamed whole at its end. Rounds alternate engines and configurations; medians.
Acceptance comes from each server's own counters (Tempo9: usage
completion_tokens_details; llama.cpp: timings draft_n / draft_n_accepted).

Usage:
  bench/spec/vs-llama.py --model M.gguf --mode draft --draft D.gguf [--ks 1,2,3,4]
  bench/spec/vs-llama.py --model M.gguf --mode ngram
Env: TEMPO9 (binary; default ~/.cache/tempo9/target/release/tempo9),
     LLAMA_CPP_BIN_DIR (default ~/.cache/tempo9/llama/native/bin).
Mode map: draft -> llama.cpp --spec-type draft-simple -md D (--spec-draft-n-max k,
--spec-draft-n-min 0); ngram -> --spec-type ngram-simple (--spec-ngram-simple-size-m k),
or another n-gram type with --llama-ngram (--spec-draft-n-max k, its defaults otherwise).
Engine tempo9-fixed is Tempo9 drafting k tokens whenever it finds drafts
(--speculation-fixed-depth) instead of its planned depths.
JSON lines of every run on stdout, a table on stderr.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HOME = os.path.expanduser("~")
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not become ready")


def server_cmd(engine, a, k, port):
    if engine.startswith("tempo9"):
        t9 = os.environ.get("TEMPO9", f"{HOME}/.cache/tempo9/target/release/tempo9")
        cmd = [t9, "serve", "--gguf", a.model, "--port", str(port), "--threads", str(a.threads),
               "--no-kv-ssd", "--ctx", "4096", "--speculation-k", str(k)]
        if k > 0:
            cmd += ["--speculation", a.mode]
            if engine == "tempo9-fixed":
                cmd += ["--speculation-fixed-depth"]
            if a.mode == "draft":
                cmd += ["--draft-gguf", a.draft]
        return cmd, {}
    d = os.environ.get("LLAMA_CPP_BIN_DIR", f"{HOME}/.cache/tempo9/llama/native/bin")
    cmd = [f"{d}/llama-server", "-m", a.model, "--port", str(port), "-t", str(a.threads),
           "-tb", str(a.threads), "-np", "1", "-c", "4096", "--no-webui", "--jinja"]
    if k > 0 and a.mode == "draft":
        cmd += ["--spec-type", "draft-simple", "-md", a.draft, "--spec-draft-n-max", str(k),
                "--spec-draft-n-min", "0", "-td", str(a.threads), "-tbd", str(a.threads)]
    elif k > 0 and a.llama_ngram == "ngram-simple":
        cmd += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(k)]
    elif k > 0:
        # The other n-gram modes: llama.cpp's defaults, at most k drafts.
        cmd += ["--spec-type", a.llama_ngram, "--spec-draft-n-max", str(k)]
    env = dict(os.environ, LD_LIBRARY_PATH=d)
    return cmd, env


def stream(port, prompt, n):
    """Streams a greedy answer of at most n tokens: `prompt` is raw text for
    /v1/completions (EOG ignored), or a dict of chat `messages`/`tools` for
    /v1/chat/completions with tool_choice required (the answer is the tool call's
    arguments, decoded under each engine's tool-call grammar)."""
    body = {"max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if isinstance(prompt, dict):
        path = "/v1/chat/completions"
        body.update(messages=prompt["messages"], tools=prompt["tools"], tool_choice="required")
    else:
        path = "/v1/completions"
        body.update(prompt=prompt, ignore_eos=True)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    times, text, last = [], [], None
    t_start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=1200) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            last = ev
            ch = ev.get("choices") or []
            piece = ch[0].get("text") if ch else None
            if ch and "delta" in ch[0]:
                d = ch[0]["delta"]
                piece = (d.get("content") or "") + "".join(
                    (c.get("function") or {}).get("arguments") or "" for c in d.get("tool_calls") or [])
            if piece:
                times.append(time.perf_counter())
                text.append(piece)
    if isinstance(prompt, dict):
        # Tool calls may come in one piece at the end (Tempo9 streams a call whole):
        # time the whole request instead (its prompt was cached by a warm-up).
        times = [t_start, time.perf_counter()]
    return times, "".join(text), last


def one(engine, a, k, prompt):
    port = free_port()
    cmd, env = server_cmd(engine, a, k, port)
    log = open(f"/tmp/spec-vs-llama-{engine}.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env or None)
    try:
        wait_ready(port, p)
        stream(port, "Hello", 8)  # warm-up
        if isinstance(prompt, dict):
            stream(port, prompt, 1)  # the chat's prompt into each engine's cache
        times, text, last = stream(port, prompt, a.tg)
        usage = (last or {}).get("usage") or {}
        n = usage.get("completion_tokens") or len(times)
        # Raw prompts: tokens after the first over the time after the first; chats:
        # all tokens over the whole (prompt-cached) request.
        done = n if isinstance(prompt, dict) else n - 1
        tok_s = done / (times[-1] - times[0]) if len(times) > 1 else 0.0
        det = usage.get("completion_tokens_details") or {}
        tim = (last or {}).get("timings") or {}
        drafted = det.get("accepted_prediction_tokens", 0) + det.get("rejected_prediction_tokens", 0)
        accepted = det.get("accepted_prediction_tokens", 0)
        if engine == "llama.cpp":
            drafted, accepted = tim.get("draft_n", 0), tim.get("draft_n_accepted", 0)
        return {"engine": engine, "mode": a.mode if k else "off", "k": k, "tokens": n,
                "tok_s": tok_s, "drafted": drafted, "accepted": accepted, "text": text}
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["draft", "ngram"], required=True)
    ap.add_argument("--draft")
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tg", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-file", default=os.path.join(HERE, "edit-code.chatml.txt"),
                    help="raw prompt text, or a .json file of chat messages and tools "
                         "(e.g. tool-json.json: a tool call under tool_choice required)")
    ap.add_argument("--engines", default="tempo9,llama.cpp")
    ap.add_argument("--llama-ngram", default="ngram-simple",
                    help="llama.cpp's --spec-type for --mode ngram (ngram-simple, ngram-map-k, ngram-mod, ngram-cache)")
    a = ap.parse_args()
    if a.mode == "draft" and not a.draft:
        sys.exit("--mode draft needs --draft")
    prompt = open(a.prompt_file).read()
    if a.prompt_file.endswith(".json"):
        prompt = json.loads(prompt)
    ks = [0] + [int(x) for x in a.ks.split(",")]
    rows = []
    for r in range(a.reps):
        for k in ks:
            for e in a.engines.split(","):
                row = one(e, a, k, prompt)
                row["round"] = r
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"{'engine':>10} {'k':>2} {'tok/s':>7} {'vs off':>7} {'accepted/drafted':>17} same-text-as-off",
          file=sys.stderr)
    for e in a.engines.split(","):
        base = statistics.median(x["tok_s"] for x in rows if x["engine"] == e and x["k"] == 0)
        off_text = next(x["text"] for x in rows if x["engine"] == e and x["k"] == 0)
        for k in ks:
            xs = [x for x in rows if x["engine"] == e and x["k"] == k]
            med = statistics.median(x["tok_s"] for x in xs)
            d, acc = sum(x["drafted"] for x in xs), sum(x["accepted"] for x in xs)
            same = all(x["text"] == off_text for x in xs)
            print(f"{e:>10} {k:>2} {med:>7.1f} {med / base:>7.2f} {acc:>8}/{d:<8} {same}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
