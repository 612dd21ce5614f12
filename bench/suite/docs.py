#!/usr/bin/env python3
"""Regenerate docs/benchmarks.md from the latest bench/results/<date>-<scenario>.json
of every suite scenario (the newest date wins; `--tag`ged files are ignored).

    python3 bench/suite/docs.py
"""

import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import SCENARIOS, defaults_lines, md_table  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
RESULTS = os.path.join(REPO, "bench", "results")
DOC = os.path.join(REPO, "docs", "benchmarks.md")

INTRO = """# Benchmarks

Tempo9 against llama.cpp's `llama-server` on the same GGUF file, same machine, one
run per scenario (method: `bench/suite/README.md`; harness and meaning of every
number: [`bench/suite/README.md`](../bench/suite/README.md)). This page is generated
by `python3 bench/suite/docs.py` from the newest result of each scenario in
`bench/results/`; the raw JSON beside each table holds every request, the
command lines and the server's resolved settings.

Both engines are measured in every table. Machine: 2 shared CPU cores, so
absolute numbers drift between runs; compare engines within one run. Tables
tagged `(h200…)` ran on the lent NVIDIA H200 (`scripts/gpu/run-h200.sh suite`) on a
synthetic Llama-3.1-8B-shape Q4_K file: Tempo9 alone, except `(h200-llama)`, where
llama.cpp's `llama-server` runs beside it with the same CUDA backend library;
`(h200-hybrid)` tables ran both engines there on the synthetic 40-layer
Qwen3.5-35B-A3B-shape Q3_K file (`run-h200.sh hybridbench1` / `hybridbench2`) and
`(qwen35moe-4l)` tables on this CPU on its first 4 layers (hybrid: gated DeltaNet +
attention, 256 experts; bench/suite/README.md "Hybrid Qwen3.5-MoE files"). The SSD tier has its own harnesses (`bench/ssd/run.py`: a long prefix
evicted and read back; `bench/ssd/agents.py`: many agents through a small RAM
budget); their newest tables
close this page.

Models: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (`qwen`) and SmolLM2-135M-Instruct
Q4_1 (`smollm2`), fetched by `scripts/fetch-models.sh`.
"""


def latest(scenario):
    return (latest_all(scenario) or [None])[0]


def latest_all(scenario):
    """The latest result of `scenario`, then the latest of each of its variants
    written with `--tag .NAME` (`<date>-<scenario>.NAME.json`, e.g. a 15K prefix-hit)."""
    pat = re.compile(r"^(\d{4}-\d{2}-\d{2})-%s(\.[\w-]+)?\.json$" % re.escape(scenario))
    by_tag = {}
    for f in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        m = pat.match(os.path.basename(f))
        if m:
            by_tag[m.group(2) or ""] = f
    return [by_tag[t] for t in sorted(by_tag)]


def ssd_sections():
    """The newest `bench/ssd/run.py` (ssd-tier) and `bench/ssd/agents.py` (ssd-agents)
    result of each tag, as its own summary table."""
    out = []
    for path in latest_all("ssd-tier") + latest_all("ssd-agents"):
        md = os.path.splitext(path)[0] + ".md"
        if not os.path.exists(md):
            continue
        stem = os.path.splitext(os.path.relpath(path, os.path.dirname(DOC)))[0]
        lines = open(md).read().rstrip().splitlines()
        title = lines[0].lstrip("# ") if lines and lines[0].startswith("#") else "SSD tier"
        out += ["## " + title, "", "Raw: [`%s.json`](%s.json)." % (os.path.basename(stem), stem), ""]
        out += lines[1:] + [""]
    return out


def main():
    out = [INTRO]
    done = set()
    for scen, path in ((sc, p) for sc in SCENARIOS for p in latest_all(sc)):
        with open(path) as f:
            res = json.load(f)
        done.add(scen)
        stem = os.path.splitext(os.path.relpath(path, os.path.dirname(DOC)))[0]
        s = res.get("summary") or {}
        tag = os.path.basename(path)[11 + len(scen):-len(".json")].lstrip(".")
        out += ["## %s" % (scen + (" (%s)" % tag if tag else "")), "",
                "Run %s, %.0f s, `%s`. Raw: [`%s.json`](%s.json), summary [`%s.md`](%s.md)." % (
                    res["started"][:16].replace("T", " "), res.get("duration_s", 0), res["command"],
                    os.path.basename(stem), stem, os.path.basename(stem), stem), ""]
        if res.get("model_note"):
            out += ["Model: " + res["model_note"], ""]
        if res.get("note"):
            out += ["Note: " + res["note"], ""]
        for r in res.get("runs", []):
            ol = r.get("other_load")
            if ol and (ol.get("other_cores_avg") or 0) > 0.3:
                out += ["*%s run contended: other processes used %.2f cores on average.*" % (
                    r["engine"], ol["other_cores_avg"]), ""]
        for k, why in (res.get("skipped") or {}).items():
            out += ["*%s not measured: %s*" % (k, why), ""]
        if s.get("table", {}).get("rows"):
            out += md_table(s["table"]) + [""]
        for n in s.get("notes", []):
            out.append("- " + n)
        if os.path.exists(os.path.splitext(path)[0] + ".png"):
            out += ["", "![%s](%s.png)" % (scen, stem)]
        dl = defaults_lines(res)
        if dl:
            out += ["", "<details><summary>llama.cpp defaults in force</summary>", "", "```"] + dl + ["```", "",
                                                                                                   "</details>"]
        out.append("")
    out += ssd_sections()
    missing = [x for x in SCENARIOS if x != "agents" and not latest(x)]
    if "agents" in done:
        missing = [x for x in missing if not x.startswith("agents-")]
    if missing:
        out += ["## Not run yet", "",
                "No committed result for: %s. Run them with `python3 bench/suite/run.py SCENARIO`." % ", ".join(
                    "`%s`" % x for x in missing), ""]
    os.makedirs(os.path.dirname(DOC), exist_ok=True)
    # Commands recorded with absolute paths into this checkout name them relative to it.
    text = "\n".join(out).replace(REPO + "/", "")
    with open(DOC, "w") as f:
        f.write(text)
    print("wrote", os.path.relpath(DOC, REPO))


if __name__ == "__main__":
    main()
