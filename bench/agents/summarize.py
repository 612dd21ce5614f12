#!/usr/bin/env python3
"""Summarizes bench/agents logs: one row per client.

    python3 summarize.py bench/agents/logs/<date>

Reads <client>/requests.jsonl (the proxy's record of every exchange),
<client>/server.log (TEMPO9_LOG=info: time to first token and token counts per
generation, in order) and <client>/version.txt, exit.txt. Writes
<dir>/summary.json and prints a Markdown table.
"""

import json
import os
import re
import sys

GEN_PATHS = ("/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/completions",
             "/api/chat", "/api/generate")


def sse_payloads(body):
    out = []
    for line in body.splitlines():
        if line.startswith("data:"):
            try:
                out.append(json.loads(line[5:].strip()))
            except ValueError:
                pass
    return out


def tool_calls(rec):
    """Names of the tool calls in one answer (any API shape)."""
    body = rec.get("response") or ""
    names = []
    payloads = sse_payloads(body)
    if not payloads:
        try:
            payloads = [json.loads(body)]
        except ValueError:
            payloads = []
    seen = set()
    for p in payloads:
        if not isinstance(p, dict):
            continue
        # Anthropic
        if p.get("type") == "content_block_start" and p["content_block"].get("type") == "tool_use":
            names.append(p["content_block"]["name"])
        if p.get("type") == "message" and isinstance(p.get("content"), list):
            names += [b["name"] for b in p["content"] if b.get("type") == "tool_use"]
        # Responses
        if p.get("type") == "response.output_item.done" and p["item"].get("type") == "function_call":
            names.append(p["item"]["name"])
        if p.get("object") == "response" and isinstance(p.get("output"), list):
            names += [o["name"] for o in p["output"] if o.get("type") == "function_call"]
        # Chat completions (streamed deltas or one message)
        for ch in p.get("choices") or []:
            for tc in (ch.get("delta") or ch.get("message") or {}).get("tool_calls") or []:
                key = (tc.get("index"), tc.get("id"))
                name = (tc.get("function") or {}).get("name")
                if name and key not in seen:
                    seen.add(key)
                    names.append(name)
    return names


def cached_of(u):
    if not isinstance(u, dict):
        return None
    if "cache_read_input_tokens" in u:
        return u["cache_read_input_tokens"]
    for k in ("prompt_tokens_details", "input_tokens_details"):
        if isinstance(u.get(k), dict):
            return u[k].get("cached_tokens")
    return None


def prompt_of(u):
    if not isinstance(u, dict):
        return None
    if "cache_read_input_tokens" in u:
        return u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0)
    return u.get("prompt_tokens", u.get("input_tokens"))


def server_generations(path):
    """(ttft_s, finished fields) per generation, in order, from server.log."""
    ttfts, fins = [], []
    if not os.path.exists(path):
        return ttfts, fins
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for line in open(path, errors="replace"):
        line = ansi.sub("", line)
        m = re.search(r"first token ttft_secs=([\d.]+)", line)
        if m:
            ttfts.append(float(m.group(1)))
        if "generation finished" in line:
            f = dict(re.findall(r'(\w+)="?([\w.]+)"?', line.split("generation finished", 1)[1]))
            fins.append(f)
    return ttfts, fins


def model_mappings(path):
    """The server's "requests for model X are answered by Y" lines: (X, Y) pairs."""
    out = []
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            m = re.search(r'requests for model "([^"]*)" are answered by \'([^\']*)\'', line)
            if m:
                out.append([m.group(1), m.group(2)])
    return out


def summarize(d):
    recs = []
    p = os.path.join(d, "requests.jsonl")
    if os.path.exists(p):
        recs = [json.loads(l) for l in open(p)]
    gens = [r for r in recs if r["method"] == "POST" and r["path"].split("?")[0] in GEN_PATHS
            and not r["path"].startswith("/v1/messages/count_tokens")]
    gens.sort(key=lambda r: r["t_start"])
    ttfts, fins = server_generations(os.path.join(d, "server.log"))
    calls = [tool_calls(r) for r in gens]
    read = lambda f: open(os.path.join(d, f)).read().strip() if os.path.exists(os.path.join(d, f)) else ""
    per_request = []
    for i, r in enumerate(gens):
        per_request.append({
            "path": r["path"], "status": r["status"], "total_s": r["total_s"],
            "prompt_tokens": prompt_of(r["usage"]), "cached_tokens": cached_of(r["usage"]),
            "tool_calls": calls[i],
            "ttft_s": round(ttfts[i], 2) if i < len(ttfts) else None,
        })
    return {
        "client": os.path.basename(d),
        "version": read("version.txt").splitlines()[0] if read("version.txt") else "",
        "apis": sorted({r["path"].split("?")[0] for r in gens}),
        # The model names the client sent (none configured on the server: issue 35),
        # and the server's log of which model answered them.
        "models_sent": sorted({str((r["request"] or {}).get("model")) for r in gens
                               if isinstance(r["request"], dict)}),
        "model_mapping": model_mappings(os.path.join(d, "server.log")),
        "other_requests": sorted({"%s %s %d" % (r["method"], r["path"].split("?")[0], r["status"])
                                  for r in recs if r not in gens}),
        "model_requests": len(gens),
        "errors": [x for x in per_request if x["status"] >= 400],
        "tool_calls": [c for cs in calls for c in cs],
        "requests": per_request,
        "exit": read("exit.txt").replace("\n", " "),
    }


def main():
    root = sys.argv[1]
    rows = [summarize(os.path.join(root, c)) for c in sorted(os.listdir(root))
            if os.path.isdir(os.path.join(root, c))]
    json.dump(rows, open(os.path.join(root, "summary.json"), "w"), indent=1)
    print("| client | version | API | model sent | model requests | tool calls | 1st request: prompt tok, TTFT, total | 2nd request: prompt tok, cached tok, TTFT | every request: cached/prompt tok | exit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in rows:
        rq = s["requests"]
        f = lambda x, k: "-" if x is None or x.get(k) is None else x[k]
        r1 = rq[0] if rq else None
        r2 = rq[1] if len(rq) > 1 else None
        print("| %s | %s | %s | %s | %d | %s | %s, %ss, %ss | %s, %s, %ss | %s | %s |" % (
            s["client"], s["version"], ", ".join(s["apis"]), ", ".join(s["models_sent"]),
            s["model_requests"],
            ", ".join(s["tool_calls"]) or "none",
            f(r1, "prompt_tokens"), f(r1, "ttft_s"), f(r1, "total_s"),
            f(r2, "prompt_tokens"), f(r2, "cached_tokens"), f(r2, "ttft_s"),
            ", ".join("%s/%s" % (f(x, "cached_tokens"), f(x, "prompt_tokens")) for x in rq) or "-",
            s["exit"]))


if __name__ == "__main__":
    main()
