#!/usr/bin/env python3
"""Soak: N clients for T seconds against a real `tempo9 serve` on loopback.

Each client loops over a seeded mix of requests until the deadline: OpenAI chat and
responses, Anthropic messages and Ollama chat, streaming and not, with tools and JSON
schemas, long and short prompts sharing prefixes (so the prefix cache, eviction and
the SSD tier all work), sampled requests, clients that disconnect mid-stream or
mid-prefill, streams cancelled by the official clients, and malformed requests.
A sampler records the server's RSS and `/v1/status` (KV pages, SSD pages and bytes,
queue) every second.

At the end:
- every greedy request that completed is run again alone, in the same API and mode,
  and its answer (text, tool calls, finish reason) must be identical (the server runs
  with `--deterministic`, so batching cannot reorder near ties);
- the server must be back at its idle baseline: nothing running, waiting or loading,
  no KV page in use (cached prefix pages may stay), no open stream, no state slot
  live, no SSD write pending, and the SSD tier's page files on disk must match its
  accounting (count and bytes);
- no request may have failed with a 5xx or a dropped connection, and the server must
  still be running.

Bounded: clients start no request after the deadline, every request has a timeout,
the replay has its own time cap, and traffic goes to 127.0.0.1 only.

    python3 bench/soak/soak.py --gguf ~/.cache/tempo9/models/smollm2-135m-instruct-q4_1.gguf \
        --clients 64 --seconds 600 --out bench/results/soak.json

Exit status 0 when every check passed. `run()` is what tests/e2e/test_soak.py calls.
"""

import argparse
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

import anthropic
import httpx
import ollama
import openai

REQUEST_TIMEOUT = 180  # seconds; a request slower than this is an error

# Long shared prefixes: documents the prompts quote, so prompts share whole KV pages
# (the prefix cache), and long ones need several pages (eviction, the SSD tier).
WORDS = ("river stone lamp orbit cedar mango violet signal harbor copper lattice falcon "
         "ember quartz meadow anchor pixel tundra saffron beacon").split()


def document(i, words):
    r = random.Random(1000 + i)
    return "Document %d. " % i + " ".join(r.choice(WORDS) + ("." if r.random() < 0.1 else "")
                                           for _ in range(words))


DOCS = [document(i, 220) for i in range(4)]  # about 300-350 tokens each: 5-6 KV pages
QUESTIONS = [
    "Summarize the text in one sentence.",
    "Which word appears most often?",
    "Write a haiku about the text.",
    "List three words from the text.",
    "What is the first word after the title?",
    "Say hello.",
    "Count from 1 to 5.",
    "What is the capital of France?",
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                           "rank": {"type": "integer"}},
          "required": ["city", "rank"], "additionalProperties": False}


def messages(rng):
    """A conversation: short (a question alone) or long (a shared document first)."""
    q = rng.choice(QUESTIONS)
    if rng.random() < 0.5:
        return "You are terse.", q
    return "You are terse. " + rng.choice(DOCS), q


# ---------------------------------------------------------------------------
# Greedy calls: a call is (api, stream, params); run_call() returns a canonical answer.

class Clients:
    def __init__(self, base, key):
        self.base, self.key = base, key
        self.openai = openai.OpenAI(base_url=base + "/v1", api_key=key or "x", max_retries=0,
                                    timeout=REQUEST_TIMEOUT)
        self.anthropic = anthropic.Anthropic(base_url=base, api_key=key or "x", max_retries=0,
                                             timeout=REQUEST_TIMEOUT)
        headers = {"Authorization": "Bearer " + key} if key else {}
        self.ollama = ollama.Client(host=base, headers=headers, timeout=REQUEST_TIMEOUT)


def run_call(c, model, call, cancel_after=None):
    """Runs one call; returns {"text", "tools", "finish"}. With `cancel_after`, a
    streaming call stops reading after that many events and closes the stream."""
    api, stream, p = call["api"], call["stream"], call["params"]
    system, user, n = p["system"], p["user"], p["max_tokens"]
    text, tools, finish, events = [], [], None, 0
    if api == "openai_chat":
        kw = dict(model=model, messages=[{"role": "system", "content": system},
                                         {"role": "user", "content": user}],
                  max_tokens=n, temperature=p.get("temperature", 0))
        if "seed" in p:
            kw["seed"] = p["seed"]
        if p.get("tools"):
            kw["tools"] = TOOLS
        if p.get("schema"):
            kw["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
        if not stream:
            ch = c.openai.chat.completions.create(**kw).choices[0]
            text.append(ch.message.content or "")
            tools = [(t.function.name, t.function.arguments) for t in ch.message.tool_calls or []]
            finish = ch.finish_reason
        else:
            s = c.openai.chat.completions.create(stream=True, **kw)
            args = {}
            for chunk in s:
                events += 1
                if cancel_after is not None and events >= cancel_after:
                    s.close()
                    return None
                for ch in chunk.choices:
                    text.append(ch.delta.content or "")
                    for t in ch.delta.tool_calls or []:
                        name, a = args.get(t.index, ("", ""))
                        args[t.index] = (name + (t.function.name or ""), a + (t.function.arguments or ""))
                    finish = ch.finish_reason or finish
            tools = [args[i] for i in sorted(args)]
    elif api == "openai_responses":
        kw = dict(model=model, instructions=system, input=user, max_output_tokens=n, temperature=0)
        if not stream:
            r = c.openai.responses.create(**kw)
            for o in r.output:
                if o.type == "message":
                    text.extend(part.text for part in o.content if part.type == "output_text")
                elif o.type == "function_call":
                    tools.append((o.name, o.arguments))
            finish = r.status
        else:
            s = c.openai.responses.create(stream=True, **kw)
            for e in s:
                events += 1
                if cancel_after is not None and events >= cancel_after:
                    s.close()
                    return None
                if e.type == "response.output_text.delta":
                    text.append(e.delta)
                elif e.type == "response.completed":
                    finish = e.response.status
    elif api == "anthropic":
        kw = dict(model=model, system=system, max_tokens=n, extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": user}])
        if p.get("tools"):
            kw["tools"] = [{"name": t["function"]["name"], "description": t["function"]["description"],
                            "input_schema": t["function"]["parameters"]} for t in TOOLS]
        if not stream:
            m = c.anthropic.messages.create(**kw)
            for b in m.content:
                if b.type == "text":
                    text.append(b.text)
                elif b.type == "tool_use":
                    tools.append((b.name, json.dumps(b.input, sort_keys=True)))
            finish = m.stop_reason
        else:
            with c.anthropic.messages.stream(**kw) as s:
                for e in s:
                    events += 1
                    if cancel_after is not None and events >= cancel_after:
                        return None  # leaving the `with` closes the response
                m = s.get_final_message()
            for b in m.content:
                if b.type == "text":
                    text.append(b.text)
                elif b.type == "tool_use":
                    tools.append((b.name, json.dumps(b.input, sort_keys=True)))
            finish = m.stop_reason
    elif api == "ollama":
        kw = dict(model=model, messages=[{"role": "system", "content": system},
                                         {"role": "user", "content": user}],
                  options={"temperature": 0, "num_predict": n})
        if p.get("tools"):
            kw["tools"] = TOOLS
        if p.get("schema"):
            kw["format"] = SCHEMA
        if not stream:
            r = c.ollama.chat(**kw)
            text.append(r.message.content or "")
            tools = [(t.function.name, json.dumps(dict(t.function.arguments), sort_keys=True))
                     for t in r.message.tool_calls or []]
            finish = r.done_reason
        else:
            for part in c.ollama.chat(stream=True, **kw):
                events += 1
                if cancel_after is not None and events >= cancel_after:
                    return None  # the generator is dropped: the response closes
                text.append(part.message.content or "")
                tools += [(t.function.name, json.dumps(dict(t.function.arguments), sort_keys=True))
                          for t in part.message.tool_calls or []]
                if part.done:
                    finish = part.done_reason
    else:
        raise ValueError(api)
    return {"text": "".join(text), "tools": tools, "finish": finish}


def pick_call(rng, max_tokens):
    api = rng.choice(["openai_chat", "openai_chat", "openai_responses", "anthropic", "ollama"])
    system, user = messages(rng)
    p = {"system": system, "user": user, "max_tokens": rng.randint(max_tokens // 4, max_tokens)}
    extra = rng.random()
    if api != "openai_responses" and extra < 0.2:
        p["tools"] = True
        p["user"] = "What is the weather in Paris? " + user
    elif api in ("openai_chat", "ollama") and extra < 0.35:
        p["schema"] = True
        p["user"] = "Name a city and its rank as JSON. " + user
    return {"api": api, "stream": rng.random() < 0.5, "params": p}


# ---------------------------------------------------------------------------
# Raw HTTP: disconnects and malformed requests (the official clients cannot send these).

def raw_post(base, path, body, key, headers=None, timeout=30):
    host, port = base.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    conn.request("POST", path, body=body, headers=h)
    return conn


def disconnect(base, key, model, rng, mid_prefill):
    """A streaming chat whose client goes away: before the first token (mid-prefill,
    a long prompt) or after a few events (mid-stream)."""
    system = "You are terse. " + rng.choice(DOCS) + (" " + rng.choice(DOCS) if mid_prefill else "")
    body = json.dumps({"model": model, "stream": True, "max_tokens": 64, "temperature": 0,
                       "messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": rng.choice(QUESTIONS)}]})
    conn = raw_post(base, "/v1/chat/completions", body, key)
    try:
        if mid_prefill:
            time.sleep(rng.uniform(0.0, 0.3))
            return "sent"
        r = conn.getresponse()
        if r.status != 200:
            return r.status
        for _ in range(rng.randint(1, 4)):
            if not r.fp.readline():
                break
        return 200
    finally:
        conn.sock and conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()


def malformed_cases(model):
    """(path, body bytes, extra headers, acceptable statuses)."""
    m = json.dumps(model)
    ok4 = {400, 404, 413, 415, 422}
    return [
        ("/v1/chat/completions", b"{not json", {}, ok4),
        ("/v1/chat/completions", b'{"model": %s}' % m.encode(), {}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": "hi"}' % m.encode(), {}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": [], "max_tokens": -1}' % m.encode(), {}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": [{"role": "user", "content": "x"}],'
         b' "temperature": "hot"}' % m.encode(), {}, ok4),
        ("/v1/chat/completions", b'{"model": "no-such-model", "messages": [{"role": "user",'
         b' "content": "x"}]}', {}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": [{"role": "user", "content": "x"}],'
         b' "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":'
         b' {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}' % m.encode(), {}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": [{"role": "user", "content": "x"}],'
         b' "tools": [{"type": "function"}]}' % m.encode(), {}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": [{"role": "user", "content": "x"}]}'
         % m.encode(), {"Content-Type": "text/plain"}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": [{"role": "user", "content": "%s"}]}'
         % (m.encode(), b"word " * 6000), {}, ok4),  # longer than the context
        ("/v1/responses", b'{"model": %s, "input": 42}' % m.encode(), {}, ok4),
        ("/v1/messages", b'{"model": %s, "messages": [{"role": "user", "content": "x"}]}' % m.encode(),
         {}, ok4),  # no max_tokens
        ("/v1/messages", b'{"model": %s, "max_tokens": 4, "messages": [{"role": "robot",'
         b' "content": "x"}]}' % m.encode(), {}, ok4),
        ("/api/chat", b'{"model": %s, "messages": [{"role": "user", "content": 5}]}' % m.encode(), {}, ok4),
        # A path in the model name reaches no file (Ollama names are checked before the
        # store is read); with one model served, any name is answered by it (an empty
        # message list is Ollama's "load": 200), unless --strict-model-names.
        ("/api/chat", b'{"model": "../../etc/passwd", "messages": []}', {}, ok4 | {200}),
        ("/api/generate", b"[1, 2, 3]", {}, ok4),
        ("/v1/chat/completions", b'{"model": %s, "messages": [{"role": "user", "content": "\xff\xfe"}]}'
         % m.encode(), {}, ok4),
    ]


def malformed(base, key, model, rng):
    path, body, headers, ok = rng.choice(malformed_cases(model))
    # Refusals are quick, but at 64 clients on 2 cores the server's threads may not
    # run for a while: the requests' own timeout.
    conn = raw_post(base, path, body, key, headers, timeout=REQUEST_TIMEOUT)
    try:
        r = conn.getresponse()
        r.read()
        return r.status, r.status in ok, path
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# Server, sampler, checks.

def status_json(base, key, timeout=10):
    req = urllib.request.Request(base + "/v1/status",
                                 headers={"Authorization": "Bearer " + key} if key else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Sampler(threading.Thread):
    def __init__(self, base, key, pid):
        super().__init__(daemon=True)
        self.base, self.key, self.pid = base, key, pid
        self.samples, self.stop = [], threading.Event()
        self.t0 = time.time()

    def run(self):
        while not self.stop.is_set():
            t = time.time()
            s = {"t": round(t - self.t0, 1), "rss_kib": rss_kib(self.pid)}
            try:
                st = status_json(self.base, self.key)
                s.update(running=st["queue"]["running"], waiting=st["queue"]["waiting"],
                         loading=st["queue"]["loading"], pages_used=st["kv"]["ram"]["used"],
                         pages_cached=st["kv"]["ram"]["cached"], pages_free=st["kv"]["ram"]["free"],
                         ssd_pages=st["kv"]["ssd"]["pages"], ssd_bytes=st["kv"]["ssd"]["bytes"],
                         ssd_pending=st["kv"]["ssd"]["pending_pages"],
                         preemptions=st["totals"]["preemptions"],
                         evicted_pages=st["totals"]["evicted_pages"],
                         streams=st["server"]["status_streams"])
            except Exception as e:  # noqa: BLE001 - a failed sample is recorded, not fatal
                s["error"] = repr(e)[:200]
            self.samples.append(s)
            self.stop.wait(max(0.0, 1.0 - (time.time() - t)))


def start_server(binary, gguf, kv_dir, log_path, extra=(), key="soak-key"):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = "http://127.0.0.1:%d" % port
    cmd = [binary, "serve", "--gguf", gguf, "--host", "127.0.0.1", "--port", str(port),
           "--deterministic", "--kv-ssd-dir", kv_dir, "--alias", "soak", *extra]
    env = dict(os.environ, TEMPO9_API_KEY=key)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("tempo9 exited with %s: see %s" % (proc.returncode, log_path))
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base, cmd
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("tempo9 did not become healthy: see " + log_path)


def wait_idle(base, key, timeout=60):
    """Polls /v1/status until nothing runs, waits, loads, streams or is pending."""
    deadline = time.time() + timeout
    st = None
    while time.time() < deadline:
        st = status_json(base, key)
        q, kv = st["queue"], st["kv"]
        if (q["running"] == q["waiting"] == q["loading"] == 0 and kv["ram"]["used"] == 0
                and kv["ssd"]["pending_pages"] == 0 and st["server"]["status_streams"] == 0
                and not st["requests"]["running"] and not st["requests"]["waiting"]):
            return st, True
        time.sleep(0.5)
    return st, False


def idle_checks(st, baseline, kv_dir):
    """The checks at the end; returns a list of failures (empty: passed)."""
    fails = []
    kv, q = st["kv"], st["queue"]
    ram = kv["ram"]
    for name, v in (("running", q["running"]), ("waiting", q["waiting"]), ("loading", q["loading"]),
                    ("pages used", ram["used"]), ("ssd pending", kv["ssd"]["pending_pages"]),
                    ("open streams", st["server"]["status_streams"])):
        if v != 0:
            fails.append("%s = %s at the end (idle baseline 0)" % (name, v))
    if ram["used"] + ram["cached"] + ram["free"] != ram["total"]:
        fails.append("RAM pages used+cached+free = %d != total %d"
                     % (ram["used"] + ram["cached"] + ram["free"], ram["total"]))
    if ram["total"] != baseline["kv"]["ram"]["total"]:
        fails.append("RAM page total changed: %d -> %d" % (baseline["kv"]["ram"]["total"], ram["total"]))
    rec, rec0 = kv.get("recurrent"), baseline["kv"].get("recurrent")
    if rec and rec0 and rec.get("live") != rec0.get("live"):
        fails.append("state slots live %s != baseline %s" % (rec.get("live"), rec0.get("live")))
    # The SSD tier's page files on disk match its accounting.
    pages, nbytes = 0, 0
    for root, _, files in os.walk(kv_dir):
        for f in files:
            if f.endswith(".page"):
                pages += 1
                nbytes += os.path.getsize(os.path.join(root, f))
    ssd = kv["ssd"]
    if (pages, nbytes) != (ssd["pages"], ssd["bytes"]):
        fails.append("SSD files on disk: %d pages, %d bytes; accounted %d pages, %d bytes"
                     % (pages, nbytes, ssd["pages"], ssd["bytes"]))
    return fails


# ---------------------------------------------------------------------------

class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}  # kind -> {status: n}
        self.errors = []  # unexpected outcomes
        self.greedy = []  # (call, answer) of completed greedy requests
        self.latency = {}  # kind -> [seconds]

    def add(self, kind, status, secs=None, error=None):
        with self.lock:
            d = self.counts.setdefault(kind, {})
            d[str(status)] = d.get(str(status), 0) + 1
            if secs is not None and status == 200:
                self.latency.setdefault(kind, []).append(secs)
            if error:
                self.errors.append("%s: %s" % (kind, error))


def status_of(e):
    for attr in ("status_code",):
        v = getattr(e, attr, None)
        if isinstance(v, int):
            return v
    if isinstance(e, (openai.APITimeoutError, anthropic.APITimeoutError, httpx.TimeoutException)):
        return "timeout"
    if isinstance(e, (openai.APIConnectionError, anthropic.APIConnectionError, httpx.TransportError,
                      ConnectionError)):
        return "connection"
    return type(e).__name__


def client_loop(i, args, base, key, model, deadline, tally):
    rng = random.Random(args.seed * 1000 + i)
    c = Clients(base, key)
    while time.time() < deadline:
        r = rng.random()
        t = time.time()
        call = None
        try:
            if r < 0.06:
                mid_prefill = rng.random() < 0.5
                kind = "disconnect_prefill" if mid_prefill else "disconnect_stream"
                s = disconnect(base, key, model, rng, mid_prefill)
                tally.add(kind, s, error=None if s in (200, "sent") else "status %s" % s)
            elif r < 0.10:
                s, ok, path = malformed(base, key, model, rng)
                tally.add("malformed", s, error=None if ok else "%s answered %s" % (path, s))
            elif r < 0.14:
                call = pick_call(rng, args.max_tokens)
                call["stream"] = True
                run_call(c, model, call, cancel_after=rng.randint(1, 3))
                tally.add("cancel_" + call["api"], 200)
            elif r < 0.20:
                call = pick_call(rng, args.max_tokens)
                call["api"], call["params"]["temperature"] = "openai_chat", 0.9
                call["params"]["seed"] = rng.randint(0, 1 << 30)
                run_call(c, model, call)
                tally.add("sampled", 200, time.time() - t)
            else:
                call = pick_call(rng, args.max_tokens)
                kind = "%s%s%s%s" % (call["api"], "_stream" if call["stream"] else "",
                                     "_tools" if call["params"].get("tools") else "",
                                     "_schema" if call["params"].get("schema") else "")
                ans = run_call(c, model, call)
                tally.add(kind, 200, time.time() - t)
                with tally.lock:
                    tally.greedy.append((call, ans))
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            s = status_of(e)
            # Overload answers are expected above the server's capacity, not errors.
            expected = s in (429, 529)
            what = "%s%s" % (call["api"], "_stream" if call["stream"] else "") if call else "raw"
            # Where it failed: the innermost frame of this file and of any library.
            frames = traceback.extract_tb(e.__traceback__)
            here = [f for f in frames if f.filename == __file__]
            where = "; ".join("%s:%d %s" % (os.path.basename(f.filename), f.lineno, f.line)
                              for f in ([here[-1]] if here else []) + frames[-1:])
            tally.add("failed", s, error=None if expected else "%s %s %r at %s" % (
                what, s, str(e)[:300], where))


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def run(binary, gguf, clients, seconds, seed=1, max_tokens=32, kv_budget="64M", ctx=4096,
        extra=(), replay_limit_s=600, log_path=None, progress=print, threads=1):
    """Starts a server, soaks it, replays, checks; returns the result dict
    (`result["failures"]` empty when every check passed). Stops the server."""
    args = argparse.Namespace(seed=seed, max_tokens=max_tokens)
    kv_dir = tempfile.mkdtemp(prefix="tempo9-soak-kv-")
    log_path = log_path or os.path.join(tempfile.gettempdir(), "tempo9-soak-%d.log" % os.getpid())
    key = "soak-key"
    proc, base, cmd = start_server(binary, gguf, kv_dir, log_path,
                                   ["--kv-budget", kv_budget, "--ctx", str(ctx), "--threads", str(threads),
                                    *extra], key)
    result = {"command": cmd, "load_before": os.getloadavg(), "clients": clients, "seconds": seconds, "seed": seed,
              "max_tokens": max_tokens, "log": log_path, "failures": []}
    try:
        model = "soak"
        baseline = status_json(base, key)
        sampler = Sampler(base, key, proc.pid)
        sampler.start()
        tally = Tally()
        t0 = time.time()
        deadline = t0 + seconds
        workers = [threading.Thread(target=client_loop, daemon=True,
                                    args=(i, args, base, key, model, deadline, tally))
                   for i in range(clients)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=max(1.0, deadline + REQUEST_TIMEOUT + 30 - time.time()))
        hung = sum(t.is_alive() for t in workers)
        soak_s = time.time() - t0
        progress("soak: %.0f s, %d greedy answers to replay" % (soak_s, len(tally.greedy)))
        if hung:
            result["failures"].append("%d clients still in a request %d s after the deadline"
                                      % (hung, REQUEST_TIMEOUT))
        idle, ok = wait_idle(base, key)
        if not ok:
            result["failures"].append("the server did not return to idle after the soak: queue %s, "
                                      "pages %s" % (idle["queue"], idle["kv"]["ram"]))
        # Replay every completed greedy request alone.
        c = Clients(base, key)
        same, diff, replay_errors, skipped = 0, [], [], 0
        t1 = time.time()
        with tally.lock:
            greedy = list(tally.greedy)
        for call, ans in greedy:
            if time.time() - t1 > replay_limit_s:
                skipped += 1
                continue
            try:
                again = run_call(c, model, call)
            except Exception as e:  # noqa: BLE001
                replay_errors.append("%s: %s" % (call["api"], repr(e)[:200]))
                continue
            if again == ans:
                same += 1
            else:
                diff.append({"call": call, "soak": ans, "alone": again})
        replay_s = time.time() - t1
        sampler.stop.set()
        sampler.join(timeout=5)
        end, ok = wait_idle(base, key)
        fails = idle_checks(end, baseline, kv_dir)
        with open(log_path) as f:
            log = f.read()
        if "panicked" in log:
            fails.append("the server log has a panic: " + log[log.index("panicked"):][:300])
        if proc.poll() is not None:
            fails.append("the server exited with %s" % proc.returncode)
        server_errors = {k: v for k, d in tally.counts.items() for s, v in d.items()
                         if s.isdigit() and int(s) >= 500 and int(s) != 529}
        rss = [s["rss_kib"] for s in sampler.samples if s.get("rss_kib")]
        result.update(
            soak_seconds=round(soak_s, 1), replay_seconds=round(replay_s, 1),
            requests=sum(sum(d.values()) for d in tally.counts.values()),
            by_kind=tally.counts,
            latency={k: {"n": len(v), "p50": round(percentile(v, 0.5), 3),
                         "p99": round(percentile(v, 0.99), 3)} for k, v in sorted(tally.latency.items())},
            unexpected=tally.errors[:50], unexpected_count=len(tally.errors),
            replayed=len(greedy) - skipped, identical=same, differing=len(diff), differing_examples=diff[:5],
            replay_errors=replay_errors[:20], replay_skipped=skipped,
            rss_kib={"start": rss[0] if rss else None, "peak": max(rss) if rss else None,
                     "end": rss_kib(proc.pid)},
            pages_total=baseline["kv"]["ram"]["total"],
            peak_pages_used=max((s.get("pages_used", 0) for s in sampler.samples), default=0),
            peak_waiting=max((s.get("waiting", 0) for s in sampler.samples), default=0),
            end_state={"queue": end["queue"], "ram": end["kv"]["ram"], "ssd": end["kv"]["ssd"],
                       "preemptions": end["totals"]["preemptions"],
                       "evicted_pages": end["totals"]["evicted_pages"],
                       "requests_started": end["totals"]["requests_started"],
                       "requests_ended": end["totals"]["requests_ended"]},
            samples=sampler.samples)
        if end["totals"]["requests_started"] != end["totals"]["requests_ended"]:
            fails.append("requests started %d != ended %d" % (end["totals"]["requests_started"],
                                                              end["totals"]["requests_ended"]))
        if tally.errors:
            fails.append("%d unexpected outcomes, e.g. %s" % (len(tally.errors), tally.errors[:3]))
        if server_errors:
            fails.append("server errors: %s" % server_errors)
        if diff:
            fails.append("%d of %d replayed greedy answers differ, e.g. %s"
                         % (len(diff), len(greedy) - skipped, json.dumps(diff[0])[:600]))
        if replay_errors:
            fails.append("%d replays failed, e.g. %s" % (len(replay_errors), replay_errors[0]))
        result["failures"] += fails
        return result
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                result["failures"].append("the server did not stop within 40 s of SIGTERM")
        shutil.rmtree(kv_dir, ignore_errors=True)


def summary(r):
    lines = ["clients %d, %.0f s soak (+%.0f s replay), %d requests" % (
        r["clients"], r.get("soak_seconds", 0), r.get("replay_seconds", 0), r.get("requests", 0))]
    for k, d in sorted(r.get("by_kind", {}).items()):
        lat = r["latency"].get(k)
        lines.append("  %-34s %s%s" % (k, json.dumps(d, sort_keys=True),
                                       "  p50 %.2f s p99 %.2f s" % (lat["p50"], lat["p99"]) if lat else ""))
    rss = r.get("rss_kib", {})
    lines.append("RSS MiB start %s peak %s end %s" % tuple(
        "%.0f" % (rss[k] / 1024) if rss.get(k) else "?" for k in ("start", "peak", "end")))
    lines.append("pages: total %s, peak used %s, end %s; peak waiting %s" % (
        r.get("pages_total"), r.get("peak_pages_used"), r.get("end_state", {}).get("ram"),
        r.get("peak_waiting")))
    lines.append("end: %s" % json.dumps({k: v for k, v in r.get("end_state", {}).items() if k != "ram"}))
    lines.append("replayed %s greedy answers alone: %s identical, %s differ, %s skipped (time cap)" % (
        r.get("replayed"), r.get("identical"), r.get("differing"), r.get("replay_skipped")))
    lines.append("checks: " + ("all passed" if not r["failures"] else "FAILED:\n  " + "\n  ".join(r["failures"])))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target"))
    ap.add_argument("--bin", default=os.environ.get("TEMPO9_BIN", os.path.join(target, "release", "tempo9")))
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=32, help="largest max_tokens of a request")
    ap.add_argument("--kv-budget", default="64M", help="small, so that pages are evicted and offloaded")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1,
                    help="server compute threads (1: on a machine shared with other work, two threads "
                         "spinning at ggml's barriers run ~3x slower than one)")
    ap.add_argument("--replay-limit", type=float, default=900, help="seconds for the replay at most")
    ap.add_argument("--out", help="write the result (with every sample) here as JSON")
    ap.add_argument("extra", nargs="*", help="more tempo9 serve flags (after --)")
    a = ap.parse_args()
    r = run(a.bin, a.gguf, a.clients, a.seconds, a.seed, a.max_tokens, a.kv_budget, a.ctx, a.extra,
            a.replay_limit, threads=a.threads)
    r["load_after"] = os.getloadavg()
    print(summary(r))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)
    sys.exit(1 if r["failures"] else 0)


if __name__ == "__main__":
    main()
