#!/usr/bin/env python3
"""Tempo9 benchmark suite: one scenario, each engine started by the harness.

    python3 bench/suite/run.py SCENARIO [--engines llamacpp,tempo9] [--model smollm2|qwen[,..]] [...]

SCENARIO: agents (both variants), agents-1.5k, agents-10k, startup-memory,
fill-memory, prefix-hit, decode, throughput, interference. See bench/suite/README.md for
what each measures, the defaults and the time each takes on 2 CPU cores.

For every engine and model: start the engine on a free 127.0.0.1 port, wait
for /health, run the scenario through the OpenAI-compatible streaming API,
stop it. Writes bench/results/<date>-<scenario>.json (raw, with command lines
and server logs' resolved defaults), .md (summary) and .png (chart, by
bench/suite/charts.py). Engines that cannot be measured (Tempo9 without an
HTTP server) are skipped with a message and listed in the result.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import charts  # noqa: E402
import client  # noqa: E402
import scenarios as sc  # noqa: E402
from engines import MODEL_INFO, MODEL_REQUEST, MODELS, REPO, make_engines  # noqa: E402

SCENARIOS = ["agents", "agents-1.5k", "agents-10k", "startup-memory", "fill-memory", "prefix-hit", "decode",
             "throughput", "interference"]

# default model(s) per scenario, chosen so that one invocation stays well under 10 minutes on 2 cores
DEFAULT_MODEL = {
    "agents": "qwen", "agents-1.5k": "smollm2", "agents-10k": "qwen",
    "startup-memory": "smollm2,qwen",
    "fill-memory": "qwen",       # 16K/32K levels need qwen's 32K trained context (smollm2: 8K)
    "prefix-hit": "qwen",        # 15K prefix needs > 8K context
    "decode": "smollm2",
    "throughput": "smollm2",
    "interference": "qwen",
}
WHY_MODEL = {
    "agents": "the ~10K-token variant does not fit SmolLM2's 8K trained context (llama-server caps slots to it)",
    "agents-10k": "a ~10K-token prompt does not fit SmolLM2's 8K trained context (llama-server caps slots to it)",
    "fill-memory": "16K/32K tokens in context need Qwen2.5-Coder's 32K trained context",
    "prefix-hit": "a 15K-token prefix needs Qwen2.5-Coder's 32K trained context",
    "agents-1.5k": "SmolLM2-135M, 4x cheaper than Qwen2.5-Coder-0.5B, keeps the run within the time bound on 2 cores",
    "decode": "SmolLM2-135M keeps 256-token repetitions short on 2 cores (Qwen2.5-Coder: --model qwen)",
    "throughput": "SmolLM2-135M keeps 16 concurrent streams within the time bound on 2 cores",
    "interference": "a ~10K-token prompt needs Qwen2.5-Coder's 32K trained context",
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--engines", default="llamacpp,tempo9", help="comma list: llamacpp, tempo9")
    ap.add_argument("--model", default=None, help="a key of engines.MODELS (smollm2, qwen, gemma3, qwen35moe-4l, "
                    "qwen35moe-35b, qwen35moe-tiny) or a comma list (default per scenario)")
    ap.add_argument("--models-dir", default=os.path.expanduser("~/.cache/tempo9/models"))
    ap.add_argument("--tempo9", default=os.path.expanduser("~/.cache/tempo9/target/release/tempo9"))
    ap.add_argument("--tempo9-extra", default="", help="extra args for the Tempo9 server")
    ap.add_argument("--tempo9-variant", action="append", default=[], metavar="ARGS",
                    help="also run a Tempo9 server with these extra args (repeatable; an A/B of a setting)")
    ap.add_argument("--llama-extra", default="", help="extra args for llama-server (recorded; default none)")
    ap.add_argument("--llama-quiet", action="store_true",
                    help="do not pass -lv 4 to llama-server (then its log omits prompt-cache/--fit decisions)")
    ap.add_argument("--allow-amx", action="store_true", help="do not preload bench/foundation/no_amx.c")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--note", default="", help="free-text note stored in the result and its summary")
    ap.add_argument("--tag", default="", help="suffix for the result file names (<date>-<scenario><tag>)")
    ap.add_argument("--timeout-s", type=int, default=590,
                    help="stop the whole invocation (engines included) after this many seconds")
    ap.add_argument("--ctx", type=int, default=None, help="override the scenario's -c / --ctx")
    ap.add_argument("--np", type=int, default=None,
                    help="llama-server -np for agents (default: not passed = auto, 4 slots with unified KV)")
    # agents
    ap.add_argument("--rounds", type=int, default=None, help="agents rounds (default 3 for ~1.5K, 2 for ~10K)")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--per-agent", type=int, default=3, help="requests per agent per round")
    ap.add_argument("--max-tokens", type=int, default=16, help="agents: tokens generated per request")
    ap.add_argument("--budget-s", type=int, default=480,
                    help="agents: start no new round after this many seconds per variant and engine; "
                         "fill-memory: skip a level predicted to end after it")
    ap.add_argument("--variant-tokens", default=None, help="agents: comma list of system prompt sizes")
    # memory
    ap.add_argument("--contexts", default="8192,32768,65536,131072", help="startup-memory: declared contexts")
    ap.add_argument("--fill-levels", default="4000,16000,31000", help="fill-memory: target tokens in context")
    ap.add_argument("--fill-ctx", type=int, default=32768, help="fill-memory: declared context")
    ap.add_argument("--settle-s", type=float, default=2.0, help="seconds to wait before reading memory")
    # prefix-hit
    ap.add_argument("--prefix-sizes", default="4000,15000")
    ap.add_argument("--warm-reps", type=int, default=3)
    # decode / throughput
    ap.add_argument("--reps", type=int, default=3, help="decode repetitions")
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--tp-tokens", type=int, default=128, help="throughput: max_tokens per stream")
    ap.add_argument("--interleave", type=int, default=0, metavar="N",
                    help="throughput: run both engines' servers at once and measure each stream count N "
                         "times, the engines back to back in alternating order, so slow spells of a shared "
                         "machine hit both (ratios per pair and their median); agents-*: N repetitions, "
                         "each on fresh servers of both engines, every round back to back in alternating "
                         "order; 0 = one engine after the other")
    ap.add_argument("--decoders", type=int, default=3, help="interference: streams decoding meanwhile")
    ap.add_argument("--long-prompt", type=int, default=10000, help="interference: long prompt tokens")
    ap.add_argument("--baseline-s", type=float, default=6.0,
                    help="interference: seconds of steady decoding measured before the long prompt")
    a = ap.parse_args(argv)
    a.contexts = [int(x) for x in a.contexts.split(",")]
    a.fill_levels = [int(x) for x in a.fill_levels.split(",")]
    a.prefix_sizes = [int(x) for x in a.prefix_sizes.split(",")]
    a.streams = [int(x) for x in a.streams.split(",")]
    return a


def _cpu_snapshot():
    """(machine busy CPU seconds from /proc/stat, CPU seconds of this process and its reaped children)."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    busy = sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)  # minus idle and iowait
    t = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), t.user + t.system + t.children_user + t.children_system


def other_load(snap0, wall):
    """CPU used by processes other than the harness and its engines during a run: the noise indicator."""
    m1, o1 = _cpu_snapshot()
    other = max(0.0, (m1 - snap0[0]) - (o1 - snap0[1]))
    return {"other_cpu_s": round(other, 1), "wall_s": round(wall, 1),
            "other_cores_avg": round(other / wall, 2) if wall > 0 else None}


def _first_server(data):
    if data.get("variants"):
        return data["variants"][0].get("server")
    return data.get("server") or next(
        (x.get("server") for key in ("levels", "sizes") for x in data.get(key, []) if x.get("server")), None)


def _close_run(run):
    t_run, snap = run.pop("_t"), run.pop("_snap")
    wall = time.perf_counter() - t_run
    run["wall_s"] = round(wall, 1)
    run["server_first"] = _first_server(run["data"])
    run["other_load"] = other_load(snap, wall)
    print("  other processes used %.2f cores on average during this run" % (
        run["other_load"]["other_cores_avg"] or 0), flush=True)


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, float):
        return "%.3f" % v if abs(v) < 10 else ("%.1f" % v if abs(v) < 1000 else "%.0f" % v)
    return str(v)


def md_table(table):
    lines = ["| " + " | ".join(table["header"]) + " |", "|" + "---|" * len(table["header"])]
    for row in table["rows"]:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return lines


def defaults_lines(result):
    """Human-readable llama.cpp defaults in force, from the first llama.cpp server record."""
    out = []
    for run in result["runs"]:
        if run["engine"] != "llama.cpp":
            continue
        srv = run.get("server_first") or {}
        r = srv.get("resolved") or {}
        if not r:
            continue
        out.append("llama.cpp (%s): `%s`" % (run["model"], " ".join(os.path.basename(c) if i == 0 else c
                                                                    for i, c in enumerate(srv["cmd"]))))
        fa = r.get("flash_attn_resolved") or next(
            (l.split("Flash Attention ")[-1] for l in r.get("log_lines", []) if "Flash Attention " in l), None)
        out.append("  in force (server log / `/props`): n_slots=%s%s, n_ctx=%s, n_ctx_slot=%s, kv_unified=%s, "
                   "flash_attn=%s%s, n_batch=%s, n_ubatch=%s, KV buffer %s MiB, slot capped to trained ctx: %s, "
                   "prompt cache (RAM): %s, threads=%s" % (
                       r.get("n_slots"), " (auto)" if r.get("np_auto") else "", r.get("n_ctx"), r.get("n_ctx_slot"),
                       r.get("kv_unified"), r.get("flash_attn"),
                       " -> %s" % fa if fa else "",
                       r.get("n_batch"), r.get("n_ubatch"), r.get("kv_buffer_mib"), r.get("capped_to_trained_ctx"),
                       r.get("prompt_cache"), r.get("threads")))
        if r.get("fit"):
            out.append("  --fit: " + " / ".join(r["fit"]))
    if out:
        out.append("  not overridden, per `llama-server --help`: prompt cache (--cache-ram 8192 MiB), "
                   "--cache-prompt, --cache-idle-slots, flash attention auto, --fit on, continuous batching, "
                   "weight repacking; AMX refused by the no-AMX shim.")
    return out


def write_markdown(result, summary, stem):
    started = result["started"]
    lines = ["# %s — %s" % (result["scenario"], started.replace("T", " ")), "",
             "Command: `%s`" % result["command"], "",
             "Engines: %s. Duration %.0f s. Load average %.1f at start, %.1f at end (2-core shared machine: "
             "compare engines within this run, not absolute numbers across runs)." % (
                 ", ".join("%s (%s)" % (r["engine"], r["model"]) for r in result["runs"]) or "none",
                 result["duration_s"], result["host"]["loadavg_start"][0], result["host"]["loadavg_end"][0]), ""]
    for k, why in result["skipped"].items():
        lines += ["**%s not measured**: %s" % (k, why), ""]
    for r in result["runs"]:
        ol = r.get("other_load")
        if ol:
            lines.append("- %s (%s): %.0f s; other processes on the machine used %.2f cores on average%s" % (
                r["engine"], r["model"], ol["wall_s"], ol["other_cores_avg"] or 0,
                " — **contended, numbers understate the engine**" if (ol["other_cores_avg"] or 0) > 0.3 else ""))
    lines.append("")
    if result.get("model_note"):
        lines += ["Model: %s" % result["model_note"], ""]
    if result.get("note"):
        lines += ["Note: %s" % result["note"], ""]
    if result.get("interrupted"):
        lines += ["**Interrupted** (%s): the data below is partial." % result["interrupted"], ""]
    lines += md_table(summary["table"]) + [""]
    for n in summary["notes"]:
        lines.append("- " + n)
    dl = defaults_lines(result)
    if dl:
        lines += ["", "Defaults in force:", "", "```"] + dl + ["```"]
    lines += ["", "Chart: `%s.png`; raw data: `%s.json`." % (os.path.basename(stem), os.path.basename(stem)), ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))
    return "\n".join(lines)


def summarize(result):
    scen = result["scenario"]
    fn = getattr(sc, "summarize_" + ("agents" if scen.startswith("agents") else scen.replace("-", "_")))
    return fn(result) if result["runs"] else {"panels": [], "table": {"header": [], "rows": []}, "notes": []}


def rerender(paths):
    """Recompute summary, markdown and chart of existing result JSONs (after changing summary code)."""
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        result["summary"] = summarize(result)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        stem = os.path.splitext(path)[0]
        write_markdown(result, result["summary"], stem)
        try:
            charts.render(result, stem + ".png")
        except Exception as e:  # noqa: BLE001 (e.g. no matplotlib here)
            print("warning: chart not written: %s" % e, file=sys.stderr)
        print("re-rendered", stem)


def _agents_targets(scen, a):
    """System prompt sizes of an agents scenario."""
    if a.variant_tokens:
        return [int(x) for x in a.variant_tokens.split(",")]
    return {"agents": [1500, 10000], "agents-1.5k": [1500], "agents-10k": [10000]}[scen]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rerender":
        return rerender(argv[1:])
    a = parse_args(argv)
    scen = a.scenario

    def _stop(signum, frame):
        raise SystemExit("stopped by signal %d%s" % (signum, " (--timeout-s %d)" % a.timeout_s
                                                      if signum == signal.SIGALRM else ""))

    for sig in (signal.SIGTERM, signal.SIGALRM):
        signal.signal(sig, _stop)  # SystemExit unwinds the `with` blocks, which stop the engines
    if a.timeout_s:
        signal.alarm(a.timeout_s)
    models = (a.model or DEFAULT_MODEL[scen]).split(",")
    for m in models:
        if m not in MODELS:
            raise SystemExit("unknown model %r (%s)" % (m, ", ".join(MODELS)))
        if not os.path.exists(os.path.join(a.models_dir, MODELS[m])):
            raise SystemExit("model %s: %s not found" % (m, os.path.join(a.models_dir, MODELS[m])))
    engines, skipped = make_engines(a.engines.split(","), a)
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    result = {
        "scenario": scen,
        "started": started.isoformat(timespec="seconds"),
        "command": shlex.join(["python3", os.path.relpath(os.path.abspath(sys.argv[0]), REPO)] +
                              argv),
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "params": {k: v for k, v in vars(a).items() if k not in ("out_dir",)},
        "models": {m: dict({"file": MODELS[m], "info": MODEL_INFO[m]},
                           **({"request_extra": MODEL_REQUEST[m]} if m in MODEL_REQUEST else {}))
                   for m in models},
        "engines": {e.key: e.describe() for e in engines},
        "skipped": skipped,
        "runs": [],
    }
    if a.note:
        result["note"] = a.note
    if scen in WHY_MODEL and not a.model:
        result["model_note"] = "%s by default: %s." % (models[0], WHY_MODEL[scen])
    open_runs = []  # runs measuring now: closed when done, or on an interruption

    def new_run(eng, model):
        run = {"engine": eng.name, "engine_key": eng.key, "model": model, "data": {},
               "_t": time.perf_counter(), "_snap": _cpu_snapshot()}
        result["runs"].append(run)
        open_runs.append(run)
        return run

    def close_runs():
        while open_runs:
            _close_run(open_runs.pop(0))

    try:
        for model in models:
            path = os.path.join(a.models_dir, MODELS[model])
            client.REQUEST_EXTRA = MODEL_REQUEST.get(model, {})  # same fields for every engine
            if a.interleave and (scen == "throughput" or scen.startswith("agents")):
                print("[%s] %s on %s, interleaved x%d" % (
                    scen, " and ".join(e.name for e in engines), model, a.interleave), flush=True)
                outs = [new_run(e, model)["data"] for e in engines]
                if scen == "throughput":
                    sc.run_throughput_interleaved(engines, model, path, a, outs)
                else:
                    for t in _agents_targets(scen, a):
                        print(" variant ~%d-token system prompt" % t, flush=True)
                        sc.run_agents_interleaved(engines, model, path, a, t, outs)
                close_runs()
                continue
            for eng in engines:
                print("[%s] %s on %s" % (scen, eng.name, model), flush=True)
                data = new_run(eng, model)["data"]
                if scen.startswith("agents"):
                    data["variants"] = []
                    for t in _agents_targets(scen, a):
                        print(" variant ~%d-token system prompt" % t, flush=True)
                        v = {}
                        data["variants"].append(v)
                        sc.run_agents(eng, model, path, a, t, out=v)
                else:
                    getattr(sc, "run_" + scen.replace("-", "_"))(eng, model, path, a, out=data)
                close_runs()
    except (SystemExit, KeyboardInterrupt) as e:
        result["interrupted"] = str(e) or type(e).__name__
        print("interrupted: %s; writing partial results" % result["interrupted"], file=sys.stderr)
        close_runs()
    result["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result["duration_s"] = round(time.perf_counter() - t0, 1)
    result["host"]["loadavg_end"] = os.getloadavg()
    signal.alarm(0)
    try:
        summary = summarize(result)
    except Exception as e:  # noqa: BLE001 (partial data after an interruption)
        summary = {"panels": [], "table": {"header": [], "rows": []}, "notes": ["summary failed: %s" % e]}
    result["summary"] = summary

    os.makedirs(a.out_dir, exist_ok=True)
    stem = os.path.join(a.out_dir, "%s-%s%s" % (started.strftime("%Y-%m-%d"), scen, a.tag))
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    md = write_markdown(result, summary, stem)
    try:
        charts.render(result, stem + ".png")
    except Exception as e:  # noqa: BLE001
        print("warning: chart not written: %s" % e, file=sys.stderr)
    print(md)
    print("wrote %s.{json,md,png} in %.0f s" % (os.path.relpath(stem, REPO), result["duration_s"]), file=sys.stderr)


if __name__ == "__main__":
    main()
