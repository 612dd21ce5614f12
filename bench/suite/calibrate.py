#!/usr/bin/env python3
"""Measure characters per token of the suite's system prompt on the models'
tokenizers with llama-server's /tokenize (llama.cpp-specific; used only to size
prompts, never to measure). Prints the ratios and the token counts of the standard
sizes; put the "project part" ratio into prompts.CHARS_PER_TOKEN_BY_MODEL (the
project context is what fills the larger prompts).

    python3 bench/suite/calibrate.py [MODEL_KEY ...] [--models-dir DIR]

Default: every key of engines.MODELS whose file is in the models directory.
"""

import argparse
import json
import os
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import prompts  # noqa: E402
from engines import MODELS, LlamaCpp  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("keys", nargs="*", help="model keys (default: all whose file exists)")
    ap.add_argument("--models-dir", default=os.path.expanduser("~/.cache/tempo9/models"))
    a = ap.parse_args()
    eng = LlamaCpp()
    keys = a.keys or [k for k, f in MODELS.items() if os.path.exists(os.path.join(a.models_dir, f))]
    for key in keys:
        path = os.path.join(a.models_dir, MODELS[key])
        with eng.server(path, ctx=2048, parallel=1) as srv:

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
            text = "".join(x["content"] for x in m)
            n = ntok(text)
            print("   agent 0 history after 9 steps: %d chars, %d tokens (%.2f c/t)" % (len(text), n, len(text) / n))


if __name__ == "__main__":
    main()
