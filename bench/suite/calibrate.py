#!/usr/bin/env python3
"""Measure characters per token of the suite's system prompt on both models with
llama-server's /tokenize (llama.cpp-specific; used only to size prompts, never
to measure). Prints the ratios and the token counts of the standard sizes.

    python3 bench/suite/calibrate.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import prompts  # noqa: E402
from engines import MODELS, LlamaCpp  # noqa: E402


def main():
    eng = LlamaCpp()
    for key, f in MODELS.items():
        path = os.path.join(os.path.expanduser("~/.cache/tempo9/models"), f)
        with eng.server(path, ctx=2048, parallel=1) as srv:
            import json
            import urllib.request

            def ntok(text):
                req = urllib.request.Request(srv.base + "/tokenize", data=json.dumps({"content": text}).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as r:
                    return len(json.loads(r.read())["tokens"])

            base = prompts.system_prompt(0)
            big = prompts.system_prompt(15000)
            nb, ng = ntok(base), ntok(big)
            print("%s: base %d chars %d tokens (%.2f c/t); project part %.2f c/t; current cpt %.2f" % (
                key, len(base), nb, len(base) / nb, (len(big) - len(base)) / (ng - nb), prompts.cpt(key)))
            for t in (1500, 4000, 10000, 15000, 16000, 31000):
                s = prompts.system_prompt(t, prompts.cpt(key))
                print("   target %5d -> %5d tokens" % (t, ntok(s)))
            m = prompts.agent_messages("", 0, 9)
            print("   agent 0 history after 9 steps: %d tokens" % ntok("".join(x["content"] for x in m)))


if __name__ == "__main__":
    main()
