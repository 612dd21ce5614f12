"""Scenario implementations. Each `run_<scenario>(engine, model_key, model_path, a)`
starts the engine as the scenario needs, measures, stops it and returns a
JSON-able dict; each `summarize_<scenario>(result)` turns the per-run data of
all engines into chart panels, a markdown table and notes (see charts.py for
the panel format).

Times are client-side (time.perf_counter around the HTTP stream) unless the
field says `server_`; memory is read from /proc of the server process.
"""

import contextlib
import statistics
import threading
import time

import prompts
from client import chat, percentile, run_concurrent

MB = 1e6


def _into(out, init):
    """Fill the caller's dict (kept in the result even if the run is interrupted)."""
    if out is None:
        out = {}
    out.update(init)
    return out


def _warmup(srv):
    """One tiny request so first-use costs (thread pools, graph allocation) do not land in a measurement."""
    return chat(srv.base, [{"role": "user", "content": "Say hi."}], max_tokens=2)


def _slim(res):
    """Per-request record kept in the JSON (the generated text cut short)."""
    d = {k: res.get(k) for k in ("ok", "ttft_s", "total_s", "decode_s", "n_deltas", "completion_tokens",
                                 "prompt_tokens", "cached_tokens", "finish_reason", "error")}
    for k in ("ttft_s", "total_s", "decode_s"):
        if d[k] is not None:
            d[k] = round(d[k], 4)
    t = res.get("timings")
    if t:
        d["server_timings"] = {k: t.get(k) for k in ("cache_n", "prompt_n", "prompt_ms", "prompt_per_second",
                                                     "predicted_n", "predicted_ms", "predicted_per_second")}
    d["text_head"] = (res.get("text") or "")[:160]
    return d


def _server_record(engine, srv):
    return {"cmd": srv.cmd, "startup_s": round(srv.startup_s, 3) if srv.startup_s else None,
            "resolved": engine.resolved(srv)}


def _cached(r):
    """Cached prompt tokens: usage.prompt_tokens_details.cached_tokens, else llama.cpp's timings.cache_n."""
    if r.get("cached_tokens") is not None:
        return r["cached_tokens"]
    return (r.get("server_timings") or {}).get("cache_n")


def _r(x, n=3):
    return None if x is None else round(x, n)


def _k(n):
    """7500 -> '7.5K', 4000 -> '4K'."""
    return "%gK" % round(n / 1000.0, 1)


def _mb(x):
    return None if x is None else round(x / MB, 1)


# ===================================================================== agents


def agents_ctx(target, n_agents, rounds, per_round, unified):
    """-c for llama.cpp: room for every agent's full history (estimate, generous)."""
    per_agent = target + 600 * rounds * per_round + 2048
    need = per_agent * n_agents
    return ((need + 4095) // 4096) * 4096


def _agents_setup(model_key, a, target):
    """System prompt, rounds and -c of an agents variant."""
    sys_text = prompts.system_prompt(target, prompts.cpt(model_key))
    rounds = a.rounds or (3 if target < 5000 else 2)
    ctx = a.ctx or agents_ctx(target, a.agents, rounds, a.per_agent, a.np is None)
    return sys_text, rounds, ctx


def _agents_round(srv, sys_text, a, rnd):
    """One round: every agent sends its `a.per_agent` next requests, one after another,
    all agents at once. Returns the round's record."""
    t_round = time.perf_counter()

    def agent_job(i):
        recs = []
        for j in range(a.per_agent):
            step = rnd * a.per_agent + j
            res = chat(srv.base, prompts.agent_messages(sys_text, i, step), max_tokens=a.max_tokens)
            rec = _slim(res)
            rec.update({"agent": i, "round": rnd, "step": step})
            recs.append(rec)
        return recs

    per_agent = run_concurrent([lambda i=i: agent_job(i) for i in range(a.agents)])
    reqs = [r for recs in per_agent for r in (recs if isinstance(recs, list) else [recs])]
    ttfts = [r["ttft_s"] for r in reqs if r.get("ttft_s") is not None]
    rd = {"round": rnd, "wall_s": _r(time.perf_counter() - t_round, 2), "n_requests": len(reqs),
          "n_ok": sum(1 for r in reqs if r.get("ok")),
          "ttft_p50_s": _r(percentile(ttfts, 50)), "ttft_p95_s": _r(percentile(ttfts, 95)),
          "ttft_max_s": _r(max(ttfts) if ttfts else None),
          "prompt_tokens": [r.get("prompt_tokens") for r in reqs],
          "cached_tokens": [_cached(r) for r in reqs], "requests": reqs}
    print("  round %d: %d/%d ok, TTFT p50 %s s p95 %s s (%.0f s)" % (
        rnd + 1, rd["n_ok"], len(reqs), rd["ttft_p50_s"], rd["ttft_p95_s"], rd["wall_s"]), flush=True)
    return rd


def run_agents(engine, model_key, model_path, a, target, out=None):
    sys_text, rounds, ctx = _agents_setup(model_key, a, target)
    out = _into(out, {"target_tokens": target, "system_chars": len(sys_text), "ctx": ctx, "np": a.np or "auto",
                      "rounds": [], "truncated": False})
    t_start = time.perf_counter()
    with engine.server(model_path, ctx=ctx, parallel=a.np) as srv:
        out["server"] = _server_record(engine, srv)
        out["warmup"] = _slim(_warmup(srv))
        for rnd in range(rounds):
            out["rounds"].append(_agents_round(srv, sys_text, a, rnd))
            if a.budget_s and time.perf_counter() - t_start > a.budget_s and rnd + 1 < rounds:
                out["truncated"] = "stopped after round %d: over --budget-s %d" % (rnd + 1, a.budget_s)
                break
        out["memory_end"] = srv.memory(model_path)
    return out


def run_agents_interleaved(engines, model_key, model_path, a, target, outs):
    """`a.interleave` repetitions of the whole scenario, each on fresh servers (cold
    caches) of every engine at once (idle ones wait on their sockets); within a
    repetition each round runs on the engines back to back, in alternating order, so a
    slow spell of the machine falls on both rounds of a pair. `outs[i]` receives one
    variant record per repetition (key "rep")."""
    sys_text, rounds, ctx = _agents_setup(model_key, a, target)
    for out in outs:
        out.setdefault("variants", [])
    for rep in range(a.interleave):
        with contextlib.ExitStack() as stack:
            srvs = [stack.enter_context(e.server(model_path, ctx=ctx, parallel=a.np)) for e in engines]
            vs = []
            for e, srv, out in zip(engines, srvs, outs):
                v = {"target_tokens": target, "system_chars": len(sys_text), "ctx": ctx,
                     "np": a.np or "auto", "rounds": [], "truncated": False, "rep": rep,
                     "server": _server_record(e, srv), "warmup": _slim(_warmup(srv))}
                out["variants"].append(v)
                vs.append(v)
            for rnd in range(rounds):
                order = list(range(len(engines)))
                if (rep + rnd) % 2:
                    order.reverse()
                for i in order:
                    print(" rep %d, %s:" % (rep + 1, engines[i].name), flush=True)
                    vs[i]["rounds"].append(_agents_round(srvs[i], sys_text, a, rnd))
            for v, srv in zip(vs, srvs):
                v["memory_end"] = srv.memory(model_path)


def _agents_label(target):
    """The table label of an agents variant: its system prompt size in suite tokens."""
    return "agents-%s" % ("%.1fk" % (target / 1000) if target < 2000 else "%dk" % (target // 1000))


def _agents_ratios(result):
    """Notes for interleaved runs: every later engine's TTFT p50 and p95 and round wall
    over the first engine's, per variant, round and repetition, and their medians."""
    runs = result["runs"]
    if len(runs) < 2 or not any("rep" in v for v in runs[0]["data"].get("variants", [])):
        return []
    notes = []
    for run_b in runs[1:]:
        notes += _agents_pair_ratios(runs[0], run_b)
    return notes


def _agents_pair_ratios(run_a, run_b):
    """`_agents_ratios` for one pair of engines."""
    b_of = {(v["target_tokens"], v["rep"]): v for v in run_b["data"]["variants"]}
    pairs = [(va, b_of[(va["target_tokens"], va["rep"])]) for va in run_a["data"]["variants"]
             if (va["target_tokens"], va["rep"]) in b_of]
    notes = []
    for target in sorted({va["target_tokens"] for va, _ in pairs}):
        for key, what in (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95"), ("wall_s", "round wall")):
            parts = []
            for rnd in range(max(len(va["rounds"]) for va, _ in pairs if va["target_tokens"] == target)):
                rs = [vb["rounds"][rnd][key] / va["rounds"][rnd][key] for va, vb in pairs
                      if va["target_tokens"] == target and len(va["rounds"]) > rnd and len(vb["rounds"]) > rnd
                      and va["rounds"][rnd].get(key) and vb["rounds"][rnd].get(key)]
                if rs:
                    parts.append("round %d %s (median **%.2f**)" % (
                        rnd + 1, ", ".join("%.2f" % r for r in rs), statistics.median(rs)))
            if parts:
                notes.append("%s: %s / %s, %s per repetition: %s." % (
                    _agents_label(target), run_b["engine"], run_a["engine"], what, "; ".join(parts)))
    return notes


def summarize_agents(result):
    panels, rows, notes = [], [], []
    by_variant = {}
    for run in result["runs"]:
        for v in run["data"]["variants"]:
            by_variant.setdefault(v["target_tokens"], []).append((run, v))
    for target, items in sorted(by_variant.items()):
        base = _agents_label(target)
        prow = []
        for run, v in items:
            rep = " rep %d" % (v["rep"] + 1) if "rep" in v else ""
            label, eng = base + rep, run["engine"]
            p50 = [r["ttft_p50_s"] for r in v["rounds"]]
            p95 = [r["ttft_p95_s"] for r in v["rounds"]]
            prow.append({"label": "%s%s p50" % (eng, rep), "engine": eng,
                         "points": [{"tag": "r%d" % (i + 1), "value": x} for i, x in enumerate(p50)]})
            prow.append({"label": "%s%s p95" % (eng, rep), "engine": eng,
                         "points": [{"tag": "r%d" % (i + 1), "value": x} for i, x in enumerate(p95)]})
            sys_tokens = None
            if v["rounds"] and v["rounds"][0]["prompt_tokens"]:
                sys_tokens = min(t for t in v["rounds"][0]["prompt_tokens"] if t) if any(
                    v["rounds"][0]["prompt_tokens"]) else None
            for r in v["rounds"]:
                rows.append([label, run["model"], eng, "round %d" % (r["round"] + 1), r["ttft_p50_s"],
                             r["ttft_p95_s"], r["ttft_max_s"], "%d/%d" % (r["n_ok"], r["n_requests"]),
                             "%s–%s" % (min(t for t in r["prompt_tokens"] if t) if any(r["prompt_tokens"]) else "?",
                                        max(t for t in r["prompt_tokens"] if t) if any(r["prompt_tokens"]) else "?"),
                             r["wall_s"]])
            if v.get("truncated"):
                notes.append("%s %s: %s" % (label, eng, v["truncated"]))
            share = []
            for r in v["rounds"]:
                pt = sum(t for t in r["prompt_tokens"] if t)
                ct = [c for c in r.get("cached_tokens", []) if c is not None]
                if pt and ct:
                    share.append("round %d %.0f%%" % (r["round"] + 1, 100.0 * sum(ct) / pt))
            if share:
                notes.append("%s %s: prompt tokens served from the prefix cache (usage cached_tokens / prompt "
                             "tokens): %s" % (label, eng, ", ".join(share)))
            notes.append("%s %s: first request prompt %s tokens (system prompt + task), -c %s, -np %s" % (
                label, eng, sys_tokens, v["ctx"], v["np"]))
        panels.append({"title": "%s: TTFT per round (range over rounds)" % base, "unit": "s",
                       "better": "lower", "rows": prow})
    table = {"header": ["variant", "model", "engine", "round", "TTFT p50 s", "TTFT p95 s", "TTFT max s", "ok",
                        "prompt tokens", "round wall s"], "rows": rows}
    return {"panels": panels, "table": table, "notes": _agents_ratios(result) + notes}


# ============================================================= startup-memory


def run_startup_memory(engine, model_key, model_path, a, out=None):
    out = _into(out, {"levels": []})
    for ctx in a.contexts:
        lv = {"ctx": ctx}
        try:
            with engine.server(model_path, ctx=ctx, parallel=1) as srv:
                time.sleep(a.settle_s)
                lv["memory"] = srv.memory(model_path)
                lv["server"] = _server_record(engine, srv)
        except Exception as e:  # noqa: BLE001
            lv["error"] = str(e)[-2000:]
        m = lv.get("memory") or {}
        print("  ctx %6d: RSS %s MB, RSS-model %s MB%s" % (ctx, _mb(m.get("VmRSS")), _mb(m.get("rss_minus_model")),
                                                         " ERROR" if "error" in lv else ""), flush=True)
        out["levels"].append(lv)
    return out


def _mem_panels(result, level_key, tag_fmt, title):
    """One panel per model; rows: each engine's RSS − resident GGUF and RSS, a point per level."""
    panels = []
    models = sorted({run["model"] for run in result["runs"]})
    for model in models:
        prow = []
        for run in result["runs"]:
            if run["model"] != model:
                continue
            for metric, mt in (("rss_minus_model", "RSS − GGUF"), ("VmRSS", "RSS"), ("gpu_used", "GPU")):
                pts = [{"tag": tag_fmt(lv[level_key]), "value": _mb(lv["memory"][metric])}
                       for lv in run["data"]["levels"] if lv.get("memory") and metric in lv["memory"]]
                if pts or metric != "gpu_used":
                    prow.append({"label": "%s %s" % (run["engine"], mt), "engine": run["engine"], "points": pts})
        gpu = any(r["label"].endswith(" GPU") for r in prow)
        panels.append({"title": "%s, %s: RSS and RSS minus resident GGUF pages%s" % (
            title, model, " (host), GPU memory" if gpu else ""), "unit": "MB", "better": "lower", "rows": prow})
    return panels


GPU_NOTE = ("GPU MB = growth of the device memory in use (nvidia-smi, all of it, not per process) from just "
            "before the server started: the server's weights, KV cache / state, compute buffers and CUDA context, "
            "as only one server runs at a time.")


def _has_gpu_memory(result):
    return any("gpu_used" in (lv.get("memory") or {}) for run in result["runs"]
               for lv in run["data"].get("levels", []))


def summarize_startup_memory(result):
    panels = _mem_panels(result, "ctx", lambda c: "%dK" % (c // 1024), "startup")
    rows, notes = [], []
    gpu = _has_gpu_memory(result)
    for run in result["runs"]:
        for lv in run["data"]["levels"]:
            m = lv.get("memory")
            res = (lv.get("server") or {}).get("resolved") or {}
            if not m:
                rows.append([run["model"], run["engine"], lv["ctx"], "failed", "", "", "", "", ""] + [""] * gpu)
                continue
            rows.append([run["model"], run["engine"], lv["ctx"], _mb(m["VmRSS"]), _mb(m["rss_minus_model"]),
                         _mb(m["model_file_rss"]), _mb(m.get("RssAnon")), res.get("kv_buffer_mib"),
                         res.get("n_ctx_slot")] + ([_mb(m.get("gpu_used"))] if gpu else []))
    for run in result["runs"]:
        capped = [lv["ctx"] for lv in run["data"]["levels"]
                  if ((lv.get("server") or {}).get("resolved") or {}).get("n_ctx_slot") not in (None, lv["ctx"])]
        if capped and run["engine"] == "llama.cpp":
            notes.append("llama.cpp %s: at declared context %s the slot is capped to the model's trained context "
                         "(n_ctx_slot), yet the KV buffer is allocated for the whole declared context." % (
                             run["model"], ", ".join("%dK" % (c // 1024) for c in capped)))
    notes.append("RSS − resident GGUF = VmRSS minus the resident pages of the mmap'd model file (/proc/PID/smaps). "
                 "For llama.cpp it still contains the CPU_REPACK copies of the weights (anonymous memory) and the "
                 "KV cache, which llama.cpp allocates and zero-fills for the whole declared context at start.")
    if gpu:
        notes.append(GPU_NOTE)
    table = {"header": ["model", "engine", "declared ctx", "RSS MB", "RSS − GGUF MB", "GGUF resident MB",
                        "RssAnon MB", "KV buffer MiB (log)", "n_ctx_slot (log)"] + (["GPU MB"] if gpu else []),
             "rows": rows}
    return {"panels": panels, "table": table, "notes": notes}


# ================================================================ fill-memory


def run_fill_memory(engine, model_key, model_path, a, out=None):
    out = _into(out, {"ctx": a.fill_ctx, "levels": []})
    with engine.server(model_path, ctx=a.fill_ctx, parallel=1) as srv:
        out["server"] = _server_record(engine, srv)
        time.sleep(a.settle_s)
        out["levels"].append({"target_tokens": 0, "memory": srv.memory(model_path)})
        t_start = time.perf_counter()
        rate, prev = None, 0
        for target in a.fill_levels:
            if rate and a.budget_s:
                # prefill slows down with depth: assume the next level runs at 2/3 of the last level's rate
                predicted = (target - prev) / (rate * 2 / 3)
                if time.perf_counter() - t_start + predicted > a.budget_s:
                    out["skipped_levels"] = out.get("skipped_levels", []) + [target]
                    out["truncated"] = ("level(s) %s skipped: predicted %.0f s would pass --budget-s %d" % (
                        out["skipped_levels"], predicted, a.budget_s))
                    print("  skip %d: predicted %.0f s over budget" % (target, predicted), flush=True)
                    continue
            sys_text = prompts.system_prompt(target, prompts.cpt(model_key))
            t0 = time.perf_counter()
            res = chat(srv.base, [{"role": "system", "content": sys_text},
                                  {"role": "user", "content": "Reply with OK."}], max_tokens=4)
            wall = time.perf_counter() - t0
            time.sleep(a.settle_s)
            lv = {"target_tokens": target, "request": _slim(res), "wall_s": round(wall, 2),
                  "memory": srv.memory(model_path)}
            out["levels"].append(lv)
            print("  %6d tokens in context (prompt %s, cached %s): RSS %s MB, RSS-model %s MB (%.0f s)%s" % (
                target, res.get("prompt_tokens"), res.get("cached_tokens"), _mb(lv["memory"]["VmRSS"]),
                _mb(lv["memory"]["rss_minus_model"]), wall, "" if res.get("ok") else " ERROR " + str(res.get("error"))),
                flush=True)
            if not res.get("ok"):
                break
            new_tokens = (res.get("prompt_tokens") or target) - (_cached(_slim(res)) or 0)
            rate = new_tokens / max(res.get("ttft_s") or wall, 1e-3)
            prev = res.get("prompt_tokens") or target
    return out


def summarize_fill_memory(result):
    def tag(t):
        return "start" if t == 0 else _k(t)
    panels = _mem_panels(result, "target_tokens", tag, "fill")
    rows = []
    gpu = _has_gpu_memory(result)
    for run in result["runs"]:
        base = run["data"]["levels"][0]["memory"]
        for lv in run["data"]["levels"]:
            m = lv["memory"]
            req = lv.get("request") or {}
            g = []
            if gpu:
                g = [_mb(m.get("gpu_used")), _mb(m["gpu_used"] - base["gpu_used"])
                     if m.get("gpu_used") is not None and base.get("gpu_used") is not None else None]
            rows.append([run["model"], run["engine"], run["data"]["ctx"], req.get("prompt_tokens", 0),
                         _mb(m["VmRSS"]), _mb(m["rss_minus_model"]), _mb(m["rss_minus_model"] - base["rss_minus_model"]),
                         lv.get("wall_s")] + g)
    table = {"header": ["model", "engine", "declared ctx", "tokens in context", "RSS MB", "RSS − GGUF MB",
                        "growth since start MB", "fill request s"] +
             (["GPU MB", "GPU growth since start MB"] if gpu else []), "rows": rows}
    notes = ["Each level is one request whose prompt extends the previous one (same prefix), so only the new "
             "part is prefilled; memory is read 'settle' seconds after the response."]
    if gpu:
        notes.append(GPU_NOTE)
    for run in result["runs"]:
        reqs = [lv["request"] for lv in run["data"]["levels"][2:] if lv.get("request")]
        if reqs and not any(_cached(r) for r in reqs):
            notes.append("%s %s: no prompt tokens served from cache after the first level (cached %s): every level "
                         "prefilled its whole prompt." % (run["engine"], run["model"],
                                                           ", ".join(str(_cached(r)) for r in reqs)))
    for run in result["runs"]:
        if run["data"].get("truncated"):
            notes.append("%s %s: %s" % (run["engine"], run["model"], run["data"]["truncated"]))
    return {"panels": panels, "table": table, "notes": notes}


# ================================================================= prefix-hit


def run_prefix_hit(engine, model_key, model_path, a, out=None):
    out = _into(out, {"sizes": []})
    for size in a.prefix_sizes:
        sys_text = prompts.system_prompt(size, prompts.cpt(model_key))
        ctx = ((size + 2048 + 1023) // 1024) * 1024 if not a.ctx else a.ctx
        sz = {"target_tokens": size, "ctx": ctx, "requests": []}
        out["sizes"].append(sz)
        with engine.server(model_path, ctx=ctx, parallel=1) as srv:
            sz["server"] = _server_record(engine, srv)
            sz["warmup"] = _slim(_warmup(srv))
            for k in range(1 + a.warm_reps):
                q = prompts.PREFIX_QUESTIONS[k % len(prompts.PREFIX_QUESTIONS)]
                res = chat(srv.base, [{"role": "system", "content": sys_text}, {"role": "user", "content": q}],
                           max_tokens=8)
                rec = _slim(res)
                rec["kind"] = "cold" if k == 0 else "warm"
                sz["requests"].append(rec)
                print("  prefix %5d %s: TTFT %s s, prompt %s, cached %s" % (
                    size, rec["kind"], rec["ttft_s"], rec["prompt_tokens"], _cached(rec)), flush=True)
    return out


def summarize_prefix_hit(result):
    panels, rows = [], []
    sizes = sorted({s["target_tokens"] for run in result["runs"] for s in run["data"]["sizes"]})
    for size in sizes:
        prow = []
        for run in result["runs"]:
            for s in run["data"]["sizes"]:
                if s["target_tokens"] != size:
                    continue
                cold = [r for r in s["requests"] if r["kind"] == "cold"]
                warm = [r for r in s["requests"] if r["kind"] == "warm"]
                prow.append({"label": "%s cold" % run["engine"], "engine": run["engine"],
                             "points": [{"tag": "cold", "value": _r(r["ttft_s"])} for r in cold]})
                prow.append({"label": "%s warm" % run["engine"], "engine": run["engine"],
                             "points": [{"tag": "w%d" % (i + 1), "value": _r(r["ttft_s"])} for i, r in enumerate(warm)]})
                c = cold[0] if cold else {}
                wt = [r["ttft_s"] for r in warm if r.get("ttft_s") is not None]
                wmed = percentile(wt, 50)
                c_pms = (c.get("server_timings") or {}).get("prompt_ms")
                w_pms = percentile([(r.get("server_timings") or {}).get("prompt_ms") for r in warm], 50)
                rows.append([run["model"], run["engine"], c.get("prompt_tokens") or size, _r(c.get("ttft_s"), 2),
                             _r(c_pms / 1000, 2) if c_pms is not None else None, _r(wmed, 3),
                             _r(w_pms / 1000, 3) if w_pms is not None else None,
                             ", ".join(str(_cached(r)) for r in warm),
                             _r(c["ttft_s"] / wmed, 1) if (c.get("ttft_s") and wmed) else None])
        panels.append({"title": "prefix-hit, ~%s-token shared prefix: TTFT cold vs warm" % _k(size),
                       "unit": "s", "better": "lower", "rows": prow, "log": True})
    table = {"header": ["model", "engine", "prompt tokens", "cold TTFT s", "cold server prefill s",
                        "warm TTFT s (median)", "warm server prefill s", "cached tokens (warm)", "cold/warm"],
             "rows": rows}
    notes = ["Cold = first request on a fresh server; warm = later requests with the same system prefix and a "
             "different user question. Cached tokens = usage.prompt_tokens_details.cached_tokens (llama.cpp: "
             "also timings.cache_n)."]
    return {"panels": panels, "table": table, "notes": notes}


# ===================================================================== decode


def run_decode(engine, model_key, model_path, a, out=None):
    sys_text = prompts.system_prompt(0)
    msgs = [{"role": "system", "content": sys_text}, {"role": "user", "content": prompts.DECODE_USER}]
    out = _into(out, {"max_tokens": a.decode_tokens, "reps": []})
    with engine.server(model_path, ctx=a.ctx or 4096, parallel=1) as srv:
        out["server"] = _server_record(engine, srv)
        out["warmup"] = _slim(_warmup(srv))
        for k in range(a.reps):
            res = chat(srv.base, msgs, max_tokens=a.decode_tokens)
            rec = _slim(res)
            n = rec["completion_tokens"] or rec["n_deltas"]
            rec["tok_s"] = _r((n - 1) / rec["decode_s"], 2) if (rec.get("decode_s") and n and n > 1) else None
            rec["text_tail"] = (res.get("text") or "")[-160:]
            out["reps"].append(rec)
            print("  rep %d: %s tokens (%s deltas), %s tok/s excl. TTFT %s s; server %s tok/s" % (
                k + 1, rec["completion_tokens"], rec["n_deltas"], rec["tok_s"], rec["ttft_s"],
                _r((rec.get("server_timings") or {}).get("predicted_per_second"), 2)), flush=True)
    return out


def summarize_decode(result):
    prow, rows, notes = [], [], []
    for run in result["runs"]:
        reps = run["data"]["reps"]
        prow.append({"label": "%s (%s)" % (run["engine"], run["model"]), "engine": run["engine"],
                     "points": [{"tag": "#%d" % (i + 1), "value": r["tok_s"]} for i, r in enumerate(reps)]})
        ts = [r["tok_s"] for r in reps if r["tok_s"]]
        ns = [r["completion_tokens"] or r["n_deltas"] for r in reps]
        rows.append([run["model"], run["engine"], _r(percentile(ts, 50), 1),
                     "%s–%s" % (_r(min(ts), 1), _r(max(ts), 1)) if ts else "",
                     _r(percentile([(r.get("server_timings") or {}).get("predicted_per_second") for r in reps], 50), 1),
                     ", ".join(str(n) for n in ns), _r(percentile([r["ttft_s"] for r in reps], 50), 3)])
        if any(n is not None and n < 200 for n in ns):
            notes.append("%s %s: fewer than 200 tokens generated in some repetitions (model stopped early)" % (
                run["engine"], run["model"]))
    notes.append("tok/s = (completion_tokens − 1) / (last content delta − first content delta), client side; "
                 "no speculative decoding.")
    panels = [{"title": "decode: single stream, tool-call JSON (range over repetitions)", "unit": "tok/s",
               "better": "higher", "rows": prow}]
    table = {"header": ["model", "engine", "tok/s (median)", "range", "server-reported tok/s", "tokens generated",
                        "TTFT s"], "rows": rows}
    return {"panels": panels, "table": table, "notes": notes}


# ================================================================= throughput


def run_throughput(engine, model_key, model_path, a, out=None):
    npar = max(a.streams)
    ctx = a.ctx or npar * 1024
    out = _into(out, {"max_tokens": a.tp_tokens, "ctx": ctx, "np": npar, "levels": []})
    with engine.server(model_path, ctx=ctx, parallel=npar) as srv:
        out["server"] = _server_record(engine, srv)
        out["warmup"] = _slim(_warmup(srv))
        for n in a.streams:
            out["levels"].append(_throughput_level(srv, n, a))
    return out


def run_throughput_interleaved(engines, model_key, model_path, a, outs):
    """Every engine's server runs at once (idle ones wait on their sockets); each
    stream count is measured `a.interleave` times, the engines back to back, in
    alternating order, so a slow spell of the machine falls on both of a pair."""
    npar = max(a.streams)
    ctx = a.ctx or npar * 1024
    with contextlib.ExitStack() as stack:
        srvs = [stack.enter_context(e.server(model_path, ctx=ctx, parallel=npar)) for e in engines]
        for e, srv, out in zip(engines, srvs, outs):
            _into(out, {"max_tokens": a.tp_tokens, "ctx": ctx, "np": npar, "levels": [],
                        "interleaved": a.interleave})
            out["server"] = _server_record(e, srv)
            out["warmup"] = _slim(_warmup(srv))
        for rep in range(a.interleave):
            for n in a.streams:
                order = list(range(len(engines)))
                if (rep + a.streams.index(n)) % 2:
                    order.reverse()
                for i in order:
                    print("  %s:" % engines[i].name, end="", flush=True)
                    lv = _throughput_level(srvs[i], n, a, rep)
                    lv["rep"] = rep
                    outs[i]["levels"].append(lv)


def _throughput_level(srv, n, a, rep=0):
    """`n` concurrent streams of `a.tp_tokens` tokens each (prompts of repetition `rep`)."""
    t0 = time.perf_counter()
    times = [[] for _ in range(n)]
    res = run_concurrent([lambda j=j: chat(srv.base, prompts.throughput_messages(j, n, rep),
                                           max_tokens=a.tp_tokens, delta_times=times[j])
                          for j in range(n)])
    wall = time.perf_counter() - t0
    recs = [_slim(r) for r in res]
    toks = sum((r["completion_tokens"] or r["n_deltas"] or 0) for r in recs)
    per = [((r["completion_tokens"] or r["n_deltas"]) - 1) / r["decode_s"] for r in recs
           if r.get("decode_s") and (r["completion_tokens"] or r["n_deltas"] or 0) > 1]
    lv = {"streams": n, "wall_s": round(wall, 3), "tokens": toks, "agg_tok_s": _r(toks / wall, 2),
          "per_stream_tok_s_median": _r(percentile(per, 50), 2),
          "ttft_p50_s": _r(percentile([r["ttft_s"] for r in recs], 50)),
          "steady_decode_tok_s": _r(_steady_decode(times), 2),
          "n_ok": sum(1 for r in recs if r["ok"]), "requests": recs}
    print("  %2d streams: %d tokens in %.1f s = %.1f tok/s aggregate (per stream %s tok/s)" % (
        n, toks, wall, toks / wall, lv["per_stream_tok_s_median"]), flush=True)
    return lv


def _median_levels(levels):
    """Interleaved runs: one level per stream count, each measure the median over the
    repetitions (tokens, wall and ok summed)."""
    by = {}
    for lv in levels:
        by.setdefault(lv["streams"], []).append(lv)
    out = []
    for n, lvs in by.items():
        def med(k):
            xs = [lv[k] for lv in lvs if lv.get(k) is not None]
            return _r(statistics.median(xs), 2) if xs else None
        out.append({"streams": n, "agg_tok_s": med("agg_tok_s"), "steady_decode_tok_s": med("steady_decode_tok_s"),
                    "per_stream_tok_s_median": med("per_stream_tok_s_median"), "ttft_p50_s": med("ttft_p50_s"),
                    "tokens": sum(lv["tokens"] for lv in lvs), "wall_s": _r(sum(lv["wall_s"] for lv in lvs), 1),
                    "n_ok": sum(lv["n_ok"] for lv in lvs), "n_req": n * len(lvs), "reps": len(lvs)})
    return out


def _interleaved_ratios(result):
    """Notes: the second engine's aggregate and steady decode over the first's, per
    back-to-back pair and the median of the pairs."""
    runs = result["runs"]
    if len(runs) != 2 or not runs[0]["data"].get("interleaved"):
        return []
    a_lv, b_lv = runs[0]["data"]["levels"], runs[1]["data"]["levels"]
    notes = []
    for key, what in (("agg_tok_s", "aggregate"), ("steady_decode_tok_s", "steady decode")):
        parts = []
        for n in sorted({lv["streams"] for lv in a_lv}):
            pairs = [(x.get(key), y.get(key)) for x in a_lv for y in b_lv
                     if x["streams"] == y["streams"] == n and x["rep"] == y["rep"]]
            rs = [y / x for x, y in pairs if x and y]
            if rs:
                parts.append("%d streams %s (median **%.2f**)" % (
                    n, ", ".join("%.2f" % r for r in rs), statistics.median(rs)))
        notes.append("%s / %s, %s tok/s per back-to-back pair: %s." % (
            runs[1]["engine"], runs[0]["engine"], what, "; ".join(parts)))
    return notes


def _steady_decode(times):
    """Aggregate decode tok/s while every stream is decoding: tokens that arrive
    between the last stream's first token and the first stream's last token, over
    that window (what llama-batched-bench's S_TG measures; prefill, prompt caching
    and arrival order drop out). None when the streams never all decode at once."""
    if not times or any(len(ts) < 2 for ts in times):
        return None
    lo = max(ts[0] for ts in times)
    hi = min(ts[-1] for ts in times)
    if hi - lo <= 0:
        return None
    return sum(1 for ts in times for t in ts if lo < t <= hi) / (hi - lo)


def summarize_throughput(result):
    prow, rows = [], []
    for run in result["runs"]:
        lvs = run["data"]["levels"]
        if run["data"].get("interleaved"):
            lvs = _median_levels(lvs)
        prow.append({"label": "%s (%s)" % (run["engine"], run["model"]), "engine": run["engine"],
                     "points": [{"tag": "×%d" % lv["streams"], "value": lv["agg_tok_s"]} for lv in lvs]})
        for lv in lvs:
            rows.append([run["model"], run["engine"], lv["streams"], lv["agg_tok_s"], lv.get("steady_decode_tok_s"),
                         lv["per_stream_tok_s_median"], lv["ttft_p50_s"], lv["tokens"], lv["wall_s"],
                         "%d/%d" % (lv["n_ok"], lv.get("n_req", lv["streams"]))])
    srow = [{"label": "%s (%s)" % (run["engine"], run["model"]), "engine": run["engine"],
             "points": [{"tag": "×%d" % lv["streams"], "value": lv.get("steady_decode_tok_s")}
                        for lv in (_median_levels(run["data"]["levels"]) if run["data"].get("interleaved")
                                   else run["data"]["levels"]) if lv.get("steady_decode_tok_s")]}
            for run in result["runs"]]
    panels = [{"title": "throughput: aggregate tok/s at 1/4/8/16 streams", "unit": "tok/s", "better": "higher",
               "rows": prow, "kind": "bars"},
              {"title": "steady decode tok/s (all streams decoding)", "unit": "tok/s", "better": "higher",
               "rows": srow, "kind": "bars"}]
    table = {"header": ["model", "engine", "streams", "aggregate tok/s", "steady decode tok/s",
                        "per-stream decode tok/s", "TTFT p50 s",
                        "tokens", "wall s", "ok"], "rows": rows}
    notes = ["aggregate tok/s = all completion tokens / wall time from the first request sent to the last stream "
             "finished (includes prefill and TTFT); per-stream decode excludes TTFT.",
             "steady decode tok/s = tokens of all streams that arrive while every stream is decoding (from the "
             "last stream's first token to the first stream's last token) over that window: the batched decode "
             "rate, without prefill, prompt caching or arrival order (llama-batched-bench's S_TG)."]
    if any(run["data"].get("interleaved") for run in result["runs"]):
        notes.append("interleaved: both servers ran at once and each stream count was measured %d times, the "
                     "engines back to back in alternating order; the table shows medians over the repetitions "
                     "(tokens, wall and ok summed). Each repetition's prompts end differently (\", repeat N\"), "
                     "so no whole prompt is served from cache." % result["runs"][0]["data"]["interleaved"])
        notes += _interleaved_ratios(result)
    return {"panels": panels, "table": table, "notes": notes}


# =============================================================== interference


def _itl(times_lists, lo, hi):
    """Inter-token gaps (s) of deltas that arrive inside [lo, hi), per stream request."""
    gaps = []
    for ts in times_lists:
        for a, b in zip(ts, ts[1:]):
            if lo <= b < hi:
                gaps.append(b - a)
    return gaps


def run_interference(engine, model_key, model_path, a, out=None):
    """3 streams decode; a long prompt arrives; how long do the streams wait between tokens while
    it prefills? Streams restart when a response ends and are cancelled once the long prompt's
    first token arrives (plus a short tail)."""
    n_dec, size = a.decoders, a.long_prompt
    sys_text = prompts.system_prompt(size, prompts.cpt(model_key))
    # llama.cpp splits -c among its -np slots: each slot must hold the long prompt.
    ctx = a.ctx or ((size + 2048 + 1023) // 1024) * 1024 * (n_dec + 1)
    out = _into(out, {"decoders": n_dec, "long_prompt_target": size, "ctx": ctx, "baseline_s": a.baseline_s})
    stop = threading.Event()
    streams = [[] for _ in range(n_dec)]  # per decoder: list of per-request delta time lists
    reqs = [[] for _ in range(n_dec)]

    def decoder(j):
        k = 0
        while not stop.is_set():
            times = []
            streams[j].append(times)
            msgs = [{"role": "user", "content": prompts.INTERFERENCE_USER % (j + 1000 * k)}]
            res = chat(srv.base, msgs, max_tokens=4000, stop_event=stop, delta_times=times)
            reqs[j].append(_slim(res))
            k += 1
            if not res["ok"]:
                break

    # -np n_dec + 1 for llama.cpp: one slot per decoder plus the long prompt.
    with engine.server(model_path, ctx=ctx, parallel=n_dec + 1) as srv:
        out["server"] = _server_record(engine, srv)
        out["warmup"] = _slim(_warmup(srv))
        th = [threading.Thread(target=decoder, args=(j,)) for j in range(n_dec)]
        t_start = time.perf_counter()
        for t in th:
            t.start()
        # Let every stream reach steady decoding before the long prompt arrives.
        while time.perf_counter() - t_start < 120 and not all(s and s[0] for s in streams):
            time.sleep(0.1)
        time.sleep(a.baseline_s)
        t_send = time.perf_counter()
        res = chat(srv.base, [{"role": "system", "content": sys_text},
                              {"role": "user", "content": "Summarize the workspace rules in one sentence."}],
                   max_tokens=4)
        t_first = t_send + (res["ttft_s"] or res["total_s"] or 0)
        time.sleep(2.0)
        stop.set()
        for t in th:
            t.join()
    all_times = [ts for s in streams for ts in s]
    base = _itl(all_times, t_send - a.baseline_s, t_send)
    during = _itl(all_times, t_send, t_first)
    out["long"] = _slim(res)
    out["decoder_requests"] = reqs
    out["itl_baseline_s"] = {"n": len(base), "p50": _r(percentile(base, 50), 4), "p95": _r(percentile(base, 95), 4),
                             "max": _r(max(base), 4) if base else None}
    out["itl_during_s"] = {"n": len(during), "p50": _r(percentile(during, 50), 4),
                           "p95": _r(percentile(during, 95), 4), "max": _r(max(during), 4) if during else None}
    out["itl_during_all"] = [round(g, 4) for g in during]
    out["tokens_during"] = len(during)
    print("  long prompt: %s tokens, TTFT %s s; decoders ITL baseline p50/p95 %s/%s s, during prefill "
          "p50/p95/max %s/%s/%s s (%d tokens)" % (
              res.get("prompt_tokens"), _r(res.get("ttft_s")), out["itl_baseline_s"]["p50"],
              out["itl_baseline_s"]["p95"], out["itl_during_s"]["p50"], out["itl_during_s"]["p95"],
              out["itl_during_s"]["max"], len(during)), flush=True)
    return out


def summarize_interference(result):
    prow, rows = [], []
    for run in result["runs"]:
        d = run["data"]
        b, du = d["itl_baseline_s"], d["itl_during_s"]
        prow.append({"label": "%s (%s)" % (run["engine"], run["model"]), "engine": run["engine"],
                     "points": [{"tag": "base p50", "value": b["p50"]}, {"tag": "base p95", "value": b["p95"]},
                                {"tag": "p50", "value": du["p50"]}, {"tag": "p95", "value": du["p95"]},
                                {"tag": "max", "value": du["max"]}]})
        lg = d.get("long") or {}
        rows.append([run["model"], run["engine"], lg.get("prompt_tokens"), _r(lg.get("ttft_s"), 2),
                     b["p50"], b["p95"], du["p50"], du["p95"], du["max"], du["n"]])
    panels = [{"title": "interference: decoders' inter-token latency while a long prompt prefills", "unit": "s",
               "better": "lower", "rows": prow, "log": True}]
    table = {"header": ["model", "engine", "long prompt tokens", "long prompt TTFT s", "ITL p50 before s",
                        "ITL p95 before s", "ITL p50 during s", "ITL p95 during s", "ITL max during s",
                        "tokens during"], "rows": rows}
    notes = ["%d streams decode (greedy, restarted when they end); after they are steady for a few seconds a "
             "request with a long system prompt arrives (cold). ITL = gap between consecutive content deltas of "
             "one stream, client side; 'during' = deltas arriving between the long request being sent and its "
             "first token." % (result["runs"][0]["data"]["decoders"] if result["runs"] else 3)]
    return {"panels": panels, "table": table, "notes": notes}
