#!/usr/bin/env python3
"""Cold prefill over HTTP, first and later: where a fresh server's first long prompt
loses time against a later one.

    python3 scripts/gpu/cold-http.py --model PATH --tempo9 BIN [--tempo9-extra ARGS]...
                                     [--llama-extra ARGS] [--size SUITE_TOKENS] [--ctx N]
                                     [--log-dir DIR]

Per engine (llama.cpp when LLAMA_CPP_BIN_DIR has llama-server; Tempo9 once per
--tempo9-extra): a fresh server, the harness's "Say hi." warm-up, then cold prompt A
(a ~SIZE-suite-token system prompt and a question), cold prompt B (another system
prompt of the same size: nothing cached), and A again with another question (warm).
Prints one JSON line per engine with the three TTFTs and the server's prompt timing
where it reports one.
"""
import argparse
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "suite"))

import prompts  # noqa: E402
from client import chat  # noqa: E402
from engines import EngineUnavailable, LlamaCpp, Tempo9  # noqa: E402


def measure(engine, model, size, ctx, log_dir, n):
    sys_a = prompts.system_prompt(size, prompts.cpt("qwen"))
    # A's text behind a different first line: the same size, and no cache hit (the
    # prefix cache and llama.cpp's slot match from the first token on).
    sys_b = "Project B. " + sys_a
    qs = prompts.PREFIX_QUESTIONS
    out = {"engine": engine.name, "extra": " ".join(engine.extra)}
    with engine.server(model, ctx=ctx, parallel=1) as srv:
        chat(srv.base, [{"role": "user", "content": "Say hi."}], max_tokens=2)
        for tag, sys_text, q in (("cold_a", sys_a, qs[0]), ("cold_b", sys_b, qs[1]), ("warm_a", sys_a, qs[2])):
            r = chat(srv.base, [{"role": "system", "content": sys_text}, {"role": "user", "content": q}],
                     max_tokens=4)
            t = r.get("timings") or {}
            out[tag] = {"ttft_s": round(r["ttft_s"], 4), "prompt_tokens": r.get("prompt_tokens"),
                        "cached_tokens": r.get("cached_tokens"), "server_prompt_ms": t.get("prompt_ms")}
        if log_dir:
            with open(os.path.join(log_dir, "cold-http-%d-%s.log" % (n, engine.key)), "w") as f:
                f.write(srv.log_text())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tempo9", required=True)
    ap.add_argument("--tempo9-extra", action="append", default=[])
    ap.add_argument("--llama-extra", default="")
    ap.add_argument("--size", type=int, default=3400)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--log-dir", help="keep each server's log here")
    a = ap.parse_args()
    engines = []
    try:
        engines.append(LlamaCpp(extra=a.llama_extra, verbose_log=False))
    except EngineUnavailable as e:
        print("llama.cpp skipped: %s" % e, file=sys.stderr)
    for x in a.tempo9_extra or [""]:
        engines.append(Tempo9(a.tempo9, extra=x))
    for n, e in enumerate(engines):
        print(json.dumps(measure(e, a.model, a.size, a.ctx, a.log_dir, n)), flush=True)


if __name__ == "__main__":
    main()
