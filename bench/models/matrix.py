#!/usr/bin/env python3
"""The model matrix: every model file through the real server, results as JSON,
and docs/models.md rendered from the committed results.

    python3 bench/models/matrix.py                  # run every file, write results, render
    python3 bench/models/matrix.py --only qwen3-tiny,smollm2-135m
    python3 bench/models/matrix.py --render-only    # re-render docs/models.md from bench/models/results/

Per file it starts `tempo9 serve` ($TEMPO9_BIN, else $CARGO_TARGET_DIR/release/tempo9)
on the file ($TEMPO9_MODELS, default ~/.cache/tempo9/models) with 2 threads, and
records: load (seconds to /health, resident memory from /proc), greedy parity with
the llama.cpp fixture of this build's CPU kernel set (`tempo9 kernels`) alone and
four requests at a time, chat through the template, a ~10K-token prompt and its
prefix-cache hit on repeat, a tool-call round trip and JSON-schema output through
/v1/chat/completions. Tokenizer and template parity come from the engine's tests
on the committed fixtures (`cargo test -p tempo9-tokenizer`, run once; --no-engine-tests
records them as not run). See bench/models/README.md.
"""

import argparse
import datetime
import json
import os
import re
import socket
import subprocess
import sys
import time
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))

from checks import (FAIL, NOT_RUN, PASS, TIE_REAL, TIE_SYNTH, Cell, chat_check,  # noqa: E402
                    greedy_alone, greedy_batched, long_prompt_check, schema_check, tool_check)
from files import FILES  # noqa: E402
import render  # noqa: E402

MODELS = os.environ.get("TEMPO9_MODELS", os.path.expanduser("~/.cache/tempo9/models"))
RESULTS = os.path.join(HERE, "results")


def binary():
    if os.environ.get("TEMPO9_BIN"):
        return os.environ["TEMPO9_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target"))
    return os.path.join(target, "release", "tempo9")


def codegen():
    """What the C compiler builds ggml for here (as the fixtures record it)."""
    if os.environ.get("TEMPO9_TARGET_CPU"):
        return os.environ["TEMPO9_TARGET_CPU"]
    out = subprocess.run(["cc", "-march=native", "-Q", "--help=target"], capture_output=True, text=True).stdout
    m = re.search(r"^\s*-march=\s*(\S+)", out, re.M)
    return m.group(1) if m else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


class Server:
    """A `tempo9 serve` process on one file."""

    def __init__(self, path, flags, log_path):
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.log = open(log_path, "w")
        cmd = [binary(), "serve", "--gguf", path, "--host", "127.0.0.1", "--port", str(self.port),
               "--threads", "2"] + list(flags)
        self.cmd = cmd
        t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("exited with %s: %s" % (self.proc.returncode, self.tail()))
            if time.time() - t0 > 600:
                self.stop()
                raise RuntimeError("not healthy after 600 s")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        self.load_s = time.time() - t0
        self.rss_kib = proc_kib(self.proc.pid, "VmRSS")

    def tail(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-600:]

    def show(self):
        req = urllib.request.Request(self.base + "/api/show", data=b'{"model":"m"}',
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def stop(self):
        peak = proc_kib(self.proc.pid, "VmHWM") if self.proc.poll() is None else None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return peak


def kernel_set():
    out = subprocess.run([binary(), "kernels"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def greedy_fixture(mf, ks, cg):
    """The fixture of this kernel set, preferring one recorded with this codegen."""
    if not mf.greedy_dir:
        return None, "no greedy fixture for this file"
    d = os.path.join(ROOT, "tests", "fixtures", mf.greedy_dir, "greedy")
    found = []
    for name in sorted(os.listdir(d)):
        fx = json.load(open(os.path.join(d, name)))
        if fx["kernel_set"]["fingerprint"] == ks["fingerprint"]:
            found.append((fx.get("codegen") or fx["kernel_set"].get("codegen"), name, fx))
    if not found:
        return None, "no %s fixture" % ks["short_name"]
    found.sort(key=lambda f: f[0] != cg)
    return found[0], None


def run_engine_tests():
    """The tokenizer crate's fixture tests, once: {test name: (passed, stderr lines)}."""
    results = {}
    for test in ("vocab_files", "tokenize_fixtures", "chat_fixtures"):
        p = subprocess.run(["cargo", "test", "--release", "-p", "tempo9-tokenizer", "--test", test,
                            "--", "--nocapture", "--test-threads", "1"],
                           cwd=ROOT, capture_output=True, text=True)
        out = p.stdout + p.stderr
        for m in re.finditer(r"^test (\w+) \.\.\. (ok|FAILED)", out, re.M):
            results[(test, m.group(1))] = m.group(2) == "ok"
        results[(test, "__log__")] = out
    return results


def engine_cell(tests, engine, note):
    if not tests:
        return Cell(NOT_RUN, note or "no fixture")
    if engine is None:
        return Cell(NOT_RUN, "engine tests not run (--no-engine-tests)")
    names = ["%s::%s" % t for t in tests]
    missing = [n for t, n in zip(tests, names) if t not in engine]
    if missing:
        return Cell(FAIL, "test did not run: %s" % ", ".join(missing))
    failed = [n for t, n in zip(tests, names) if not engine[t]]
    nums = {}
    for t in tests:
        # vocab_files' corpus tests print "<vocab>: N corpus cases, M mismatches".
        vocab = t[1].split("_corpus_")[0].replace("_", "-")
        for m in re.finditer(r"^(\S+): (\d+) corpus cases, (\d+) mismatches", engine[(t[0], "__log__")], re.M):
            if m.group(1) == vocab:
                nums[vocab] = {"cases": int(m.group(2)), "mismatches": int(m.group(3))}
    reason = ", ".join("`%s`" % n for n in names)
    for vocab, n in nums.items():
        reason += " (%s corpus: %d strings, %d mismatches)" % (vocab, n["cases"], n["mismatches"])
    return Cell(FAIL if failed else PASS, ("failed: " if failed else "") + reason, nums)


def guarded(fn, *a, **kw):
    """Runs a check; an exception is the cell's failure, with its reason."""
    try:
        return fn(*a, **kw)
    except Exception as e:  # a check's failure is data, not a crash of the matrix
        return Cell(FAIL, "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else ""))


def run_file(mf, ks, cg, engine, args):
    import openai

    row = {"file": mf.file, "arch": mf.arch, "real": mf.real}
    cells = row["cells"] = {}
    cells["tokenizer"] = engine_cell(mf.tokenizer_tests, engine, mf.tokenizer_note).to_json()
    cells["template"] = engine_cell((mf.template_test,) if mf.template_test else (), engine,
                                    mf.template_note).to_json()
    path = os.path.join(MODELS, mf.file)
    server_checks = ("load", "greedy_alone", "greedy_batched", "chat", "long_prompt", "tool_call", "json_schema")
    if not os.path.exists(path):
        for c in server_checks:
            cells[c] = Cell(NOT_RUN, "file missing (scripts/fetch-models.sh / synth-models.py)").to_json()
        return row
    row["size_bytes"] = os.path.getsize(path)
    log_path = os.path.join(args.logs, "%s.log" % mf.name)
    try:
        srv = Server(path, mf.serve_flags, log_path)
    except Exception as e:
        cells["load"] = Cell(FAIL, str(e)[:300]).to_json()
        for c in server_checks[1:]:
            cells[c] = Cell(NOT_RUN, "the server did not start").to_json()
        return row
    try:
        info = srv.show()
        max_ctx = next((v for k, v in info["model_info"].items() if k.endswith(".context_length")), 0)
        cells["load"] = Cell(PASS, "%.1f s, %d MiB resident" % (srv.load_s, srv.rss_kib // 1024),
                             {"seconds": round(srv.load_s, 2), "rss_mib": srv.rss_kib // 1024,
                              "max_context": max_ctx}).to_json()
        print("  load %.1f s" % srv.load_s, file=sys.stderr)
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", timeout=args.budget, max_retries=0)
        if mf.greedy_vision:
            fx, why = None, "the fixture's prompts carry images (crates/models/tests/vision.rs checks them)"
        else:
            fx, why = greedy_fixture(mf, ks, cg)
        if fx is None:
            cells["greedy_alone"] = cells["greedy_batched"] = Cell(NOT_RUN, why).to_json()
        else:
            fx_codegen, fx_name, fixture = fx
            source = {"fixture": "tests/fixtures/%s/greedy/%s" % (mf.greedy_dir, fx_name), "codegen": fx_codegen}
            tie = TIE_REAL if mf.real else TIE_SYNTH
            try:
                alone, outs = greedy_alone(srv.base, fixture, tie, args.budget, mf.arch,
                                           "--flash-decode" in mf.serve_flags)
            except Exception as e:
                alone, outs = Cell(FAIL, "%s: %s" % (type(e).__name__, e)), None
            alone.numbers.update(source)
            cells["greedy_alone"] = alone.to_json()
            if outs is None:
                cells["greedy_batched"] = Cell(NOT_RUN, "alone run failed").to_json()
            else:
                b = guarded(greedy_batched, srv.base, fixture, outs, tie, args.budget)
                b.numbers.update(source)
                cells["greedy_batched"] = b.to_json()
            print("  greedy %s / %s" % (cells["greedy_alone"]["status"], cells["greedy_batched"]["status"]),
                  file=sys.stderr)
        cells["chat"] = guarded(chat_check, client).to_json()
        cells["tool_call"] = guarded(tool_check, client).to_json()
        cells["json_schema"] = guarded(schema_check, client).to_json()
        if args.skip_long:
            cells["long_prompt"] = Cell(NOT_RUN, "--skip-long").to_json()
        else:
            cells["long_prompt"] = guarded(long_prompt_check, client, max_ctx, args.budget).to_json()
        print("  chat %s, tools %s, schema %s, long %s" % tuple(
            cells[c]["status"] for c in ("chat", "tool_call", "json_schema", "long_prompt")), file=sys.stderr)
    except Exception:
        stopped = "the matrix stopped on an error: " + traceback.format_exc().strip().splitlines()[-1][:200]
        cells.setdefault("load", Cell(FAIL, stopped).to_json())
    else:
        stopped = "the run stopped before this check"
    finally:
        peak = srv.stop()
        if peak and "load" in cells:
            cells["load"]["numbers"]["peak_rss_mib"] = peak // 1024
    for c in server_checks:
        cells.setdefault(c, Cell(FAIL if stopped.startswith("the matrix stopped") else NOT_RUN, stopped).to_json())
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated file names (files.py) to run, in this order; merged into the results file")
    ap.add_argument("--render-only", action="store_true", help="re-render docs/models.md from committed results")
    ap.add_argument("--out", help="results JSON (default bench/models/results/<date>-<machine>.json)")
    ap.add_argument("--machine", default=socket.gethostname().split(".")[0], help="machine label of the results")
    ap.add_argument("--budget", type=float, default=900, help="seconds one request may take")
    ap.add_argument("--skip-long", action="store_true", help="record the 10K-token prompt as not run")
    ap.add_argument("--no-engine-tests", action="store_true", help="record tokenizer/template parity as not run")
    ap.add_argument("--logs", default="/tmp/tempo9-matrix", help="server logs directory")
    ap.add_argument("--page", default=os.path.join(ROOT, "docs", "models.md"))
    args = ap.parse_args()
    if args.render_only:
        render.write_page(args.page)
        return
    os.makedirs(args.logs, exist_ok=True)
    ks, cg = kernel_set(), codegen()
    out = args.out or os.path.join(RESULTS, "%s-%s.json" % (datetime.date.today().isoformat(), args.machine))
    results = json.load(open(out)) if os.path.exists(out) else {}
    results.update({
        "machine": args.machine, "device": "cpu", "date": datetime.date.today().isoformat(),
        "kernel_set": ks["short_name"], "fingerprint": ks["fingerprint"], "codegen": cg,
        "cpu": cpu_model(), "threads": 2,
        "tempo9": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "command": "python3 bench/models/matrix.py" + (" --only " + args.only if args.only else ""),
    })
    results.setdefault("files", {})
    engine = None if args.no_engine_tests else run_engine_tests()
    # --only's order, else the smallest files first (the slowest, largest, last).
    if args.only:
        by_name = {mf.name: mf for mf in FILES}
        unknown = [n for n in args.only.split(",") if n not in by_name]
        if unknown:
            sys.exit("unknown files: %s (see files.py)" % ", ".join(unknown))
        order = [by_name[n] for n in args.only.split(",")]
    else:
        order = sorted(FILES, key=lambda mf: os.path.getsize(os.path.join(MODELS, mf.file))
                       if os.path.exists(os.path.join(MODELS, mf.file)) else 0)
    for mf in order:
        print("%s (%s)" % (mf.name, mf.file), file=sys.stderr)
        t0 = time.time()
        row = run_file(mf, ks, cg, engine, args)
        row["seconds"] = round(time.time() - t0, 1)
        # The run's meta is overwritten by a later --only run into the same file.
        row["tempo9"] = results["tempo9"]
        results["files"][mf.name] = row
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out + ".part", "w") as f:
            json.dump(results, f, indent=1, ensure_ascii=False)
        os.replace(out + ".part", out)
    render.write_page(args.page)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
