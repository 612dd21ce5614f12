#!/usr/bin/env python3
"""Greedy answers about images with the vision encoder and language model on a
GPU against both on the CPU, on the same files (the tiny Qwen3-VL pair of the
vision tests, written by `tempo9 synth-gguf`).

Each configuration is one `tempo9 serve`; every image (different sizes) is sent
with the same question, greedy, 32 tokens, and the token ids of the answers
(`logprobs`) are compared with the first configuration's. Standard library
only (it runs on the GPU machine). One JSON line per configuration on stdout.

    python3 bench/vision/gpu_vs_cpu.py --tempo9 target/release/tempo9 \\
        --gguf qwen3vl-tiny.gguf --mmproj mmproj-qwen3vl-tiny.gguf \\
        --config "cpu:--device cpu --vision-device cpu" \\
        --config "cuda:--device cuda --vision-device same"
"""

import argparse
import json
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from encode_while_decode import free_port, image_question, post, stop_server, wait_health  # noqa: E402

# Sizes as the vision fixtures vary them: upscaled, tall, wide, downscaled.
SIZES = [(20, 20), (64, 48), (40, 120), (150, 30), (300, 200)]


def answers(args, flags):
    port = free_port()
    cmd = [args.tempo9, "serve", "--gguf", args.gguf, "--mmproj", args.mmproj,
           "--host", "127.0.0.1", "--port", str(port)] + shlex.split(flags)
    log = open(os.path.join(args.log_dir, "tempo9-%d.log" % port), "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_health(port, proc, 300)
        except RuntimeError:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise
        out = []
        for k, (w, h) in enumerate(SIZES):
            r = post(port, "/v1/chat/completions", {
                "model": "m", "max_tokens": 32, "temperature": 0, "logprobs": True, "top_logprobs": 2,
                "messages": [image_question("Describe this picture.", w, h, k)]})
            lp = r["choices"][0]["logprobs"]["content"]
            out.append([(t["token"], t["logprob"], [x["logprob"] for x in t["top_logprobs"]]) for t in lp])
        return out
    finally:
        stop_server(proc)
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tempo9", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--mmproj", required=True)
    ap.add_argument("--config", action="append", required=True, help="NAME:FLAGS (the first is the reference)")
    ap.add_argument("--log-dir", default=".", help="the servers' logs go here")
    args = ap.parse_args()
    ref = None
    for c in args.config:
        name, _, flags = c.partition(":")
        a = answers(args, flags)
        if ref is None:
            ref = a
            print(json.dumps({"config": name, "flags": flags, "reference": True, "images": len(a)}), flush=True)
            continue
        same, first_diff, worst = 0, [], 0.0
        for x, y in zip(ref, a):
            n = next((i for i, (p, q) in enumerate(zip(x, y)) if p[0] != q[0]), None)
            if n is None and len(x) == len(y):
                same += 1
            # The reference's top-2 gap where the tokens part: a near-tie or not.
            gap = None if n is None else round(x[n][2][0] - x[n][2][1], 4) if len(x[n][2]) > 1 else None
            first_diff.append({"step": n, "ref_top2_gap": gap})
            for p, q in zip(x[: n if n is not None else len(x)], y):
                worst = max(worst, abs(p[1] - q[1]))
        print(json.dumps({"config": name, "flags": flags, "images": len(a), "identical": same,
                          "parts": first_diff, "max_logprob_diff_before_parting": round(worst, 5)}), flush=True)


if __name__ == "__main__":
    main()
