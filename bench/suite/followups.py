#!/usr/bin/env python3
"""The agents scenario's requests one at a time: what each costs when nothing else runs.

    python3 bench/suite/followups.py [--engines llamacpp,tempo9] [--model smollm2|qwen]
                                     [--target 1500] [--agents 4] [--steps 3] [--tag TAG]

The agents scenarios send four agents' requests at once, so a request's time to first
token there includes the other agents' work. This sends the same requests (same
system prompt, tasks and tool history as `run.py agents-*`, 16 answer tokens) one
after another: every agent's step 0, then every agent's step 1, and so on. Each
follow-up then finds its agent's previous prompt cached (Tempo9's prefix cache,
llama.cpp's slot) and nothing else computing, so its TTFT is the engine's own cost
of the new tokens at that depth. Writes bench/results/<date>-followups<tag>.{json,md}.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import prompts  # noqa: E402
import client  # noqa: E402
from client import chat  # noqa: E402
from engines import MODEL_REQUEST, MODELS, EngineUnavailable, LlamaCpp, Tempo9  # noqa: E402
from scenarios import agents_ctx  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def run_engine(engine, model_path, model_key, a):
    sys_text = prompts.system_prompt(a.target, prompts.cpt(model_key))
    ctx = agents_ctx(a.target, a.agents, 2, 3, True)  # the -c of `run.py agents-* --rounds 2`
    reqs = []
    with engine.server(model_path, ctx=ctx) as srv:
        chat(srv.base, [{"role": "user", "content": "Say hi."}], max_tokens=2)
        for step in range(a.steps):
            for i in range(a.agents):
                r = chat(srv.base, prompts.agent_messages(sys_text, i, step), max_tokens=16)
                cached = r.get("cached_tokens") or 0
                reqs.append({"agent": i, "step": step, "ok": r.get("ok"), "ttft_s": r.get("ttft_s"),
                             "prompt_tokens": r.get("prompt_tokens"), "cached_tokens": cached,
                             "new_tokens": (r.get("prompt_tokens") or 0) - cached, "error": r.get("error")})
                print("  %s agent %d step %d: TTFT %.2f s, %s new tokens" % (
                    engine.name, i, step, r.get("ttft_s") or -1, reqs[-1]["new_tokens"]), flush=True)
    return {"engine": engine.name, "ctx": ctx, "requests": reqs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="llamacpp,tempo9")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--models-dir", default=os.path.expanduser("~/.cache/tempo9/models"))
    ap.add_argument("--tempo9", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target")), "release", "tempo9"))
    ap.add_argument("--target", type=int, default=1500, help="system prompt tokens (as run.py agents-*)")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="requests per agent (step 0 = the task)")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    model_path = os.path.join(a.models_dir, MODELS[a.model])
    client.REQUEST_EXTRA = MODEL_REQUEST.get(a.model, {})  # e.g. thinking off, as run.py sends
    started = datetime.datetime.now(datetime.timezone.utc)
    runs = []
    for key in a.engines.split(","):
        try:
            engine = LlamaCpp() if key == "llamacpp" else Tempo9(a.tempo9)
        except EngineUnavailable as e:
            print("skipped %s: %s" % (key, e))
            continue
        print("[followups] %s on %s" % (engine.name, a.model), flush=True)
        runs.append(run_engine(engine, model_path, a.model, a))
    out = os.path.join(REPO, "bench", "results", "%s-followups%s" % (started.date().isoformat(), a.tag))
    cmd = "python3 bench/suite/followups.py " + " ".join(sys.argv[1:])
    with open(out + ".json", "w") as f:
        json.dump({"command": cmd, "started": started.isoformat(), "model": a.model, "target": a.target,
                   "runs": runs}, f, indent=1)
    lines = ["# followups (requests one at a time) — %s" % started.isoformat(timespec="seconds"), "",
             "Command: `%s`" % cmd, "", __doc__.split("\n\n", 2)[2].strip(), "",
             "| engine | step | TTFT s per agent | new tokens per agent | TTFT median s |", "|---|---|---|---|---|"]
    for r in runs:
        for step in range(a.steps):
            rs = [q for q in r["requests"] if q["step"] == step]
            t = [q["ttft_s"] for q in rs if q["ttft_s"] is not None]
            lines.append("| %s | %d | %s | %s | %.2f |" % (
                r["engine"], step, " / ".join("%.2f" % x for x in t),
                " / ".join(str(q["new_tokens"]) for q in rs), statistics.median(t) if t else float("nan")))
        fu = [q["ttft_s"] for q in r["requests"] if q["step"] > 0 and q["ttft_s"] is not None]
        if fu:
            lines.append("| %s | follow-ups | | | %.2f |" % (r["engine"], statistics.median(fu)))
    lines += ["", "Raw data: `%s.json`." % os.path.basename(out), ""]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
