"""Streaming OpenAI chat-completions client with client-side timing (stdlib only).

`chat(base, messages, ...)` POSTs /v1/chat/completions with "stream": true and
"stream_options": {"include_usage": true} (plus the model's REQUEST_EXTRA fields,
e.g. chat_template_kwargs), reads the server-sent events and returns a dict of
times measured on this side of the socket:

  ttft_s     request sent -> first chunk whose delta carries non-empty content
             (or reasoning_content / tool_calls): what a client sees as
             time to first token. A role-only first chunk does not count.
  total_s    request sent -> [DONE] (or end of stream)
  decode_s   first content delta -> last content delta
  n_deltas   number of content-carrying chunks
  completion_tokens / prompt_tokens / cached_tokens from the final `usage`
             chunk (cached_tokens = usage.prompt_tokens_details.cached_tokens),
             None where the server sent no usage
  timings    llama.cpp's extra `timings` object when present (prompt_n, cache_n,
             prompt_ms, predicted_n, predicted_ms, ...)
"""

import http.client
import json
import threading
import time
import urllib.parse

# Fields added to every request body (before `extra`): set by run.py per model from
# engines.MODEL_REQUEST (e.g. chat_template_kwargs), the same for every engine.
REQUEST_EXTRA = {}


def chat(base, messages, max_tokens=16, temperature=0.0, extra=None, timeout=900, stop_event=None,
         delta_times=None):
    """`stop_event` (a threading.Event) closes the stream early once set (the client
    leaves, the server cancels); `delta_times`, a list, receives the perf_counter
    time of every content delta."""
    u = urllib.parse.urlparse(base)
    body = {"messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": temperature,
            "stream_options": {"include_usage": True}}
    body.update(REQUEST_EXTRA)
    if extra:
        body.update(extra)
    data = json.dumps(body).encode("utf-8")
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    res = {"ok": False, "ttft_s": None, "total_s": None, "decode_s": None, "n_deltas": 0,
           "completion_tokens": None, "prompt_tokens": None, "cached_tokens": None, "timings": None,
           "finish_reason": None, "text": "", "error": None}
    t0 = time.perf_counter()
    res["t_send"] = time.time()
    t_first = t_last = None
    try:
        conn.request("POST", "/v1/chat/completions", body=data,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            res["error"] = "HTTP %d: %s" % (resp.status, resp.read()[:500].decode("utf-8", "replace"))
            return res
        text = []
        while True:
            if stop_event is not None and stop_event.is_set():
                break
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = time.perf_counter()
            try:
                ev = json.loads(payload)
            except ValueError:
                continue
            if ev.get("usage"):
                us = ev["usage"]
                res["completion_tokens"] = us.get("completion_tokens")
                res["prompt_tokens"] = us.get("prompt_tokens")
                det = us.get("prompt_tokens_details") or {}
                res["cached_tokens"] = det.get("cached_tokens")
            if ev.get("timings"):
                res["timings"] = ev["timings"]
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                piece = d.get("content") or d.get("reasoning_content") or ""
                if piece or d.get("tool_calls"):
                    if t_first is None:
                        t_first = now
                    t_last = now
                    res["n_deltas"] += 1
                    if delta_times is not None:
                        delta_times.append(now)
                    text.append(piece)
                if ch.get("finish_reason"):
                    res["finish_reason"] = ch["finish_reason"]
        res["text"] = "".join(text)
        res["ok"] = True
    except Exception as e:  # noqa: BLE001
        res["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()
    t_end = time.perf_counter()
    res["total_s"] = t_end - t0
    if t_first is not None:
        res["ttft_s"] = t_first - t0
        res["decode_s"] = t_last - t_first
    return res


def run_concurrent(jobs):
    """Run callables concurrently in threads; returns their results in order."""
    out = [None] * len(jobs)

    def wrap(i, f):
        try:
            out[i] = f()
        except Exception as e:  # noqa: BLE001
            out[i] = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}

    ts = [threading.Thread(target=wrap, args=(i, f)) for i, f in enumerate(jobs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def percentile(xs, p):
    """Linear-interpolated percentile (numpy's default), p in 0..100."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
