"""Renders docs/models.md from the committed matrix results.

The page is bench/models/page.md (prose only) with its `<!-- matrix -->` marker
replaced by tables built from every bench/models/results/*.json (one column group
per machine: kernel set and codegen) and the committed H200 comparisons listed in
CUDA_SOURCES. No cell is typed by hand.
"""

import glob
import json
import os

from files import FILES

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
PAGE = os.path.join(HERE, "page.md")

#: The CPU checks, in column order: (results key, column title).
CHECKS = [
    ("load", "load"),
    ("tokenizer", "tokenizer"),
    ("greedy_alone", "greedy alone"),
    ("greedy_batched", "greedy batched"),
    ("chat", "chat"),
    ("template", "template"),
    ("long_prompt", "10K prompt + cache"),
    ("tool_call", "tool call"),
    ("json_schema", "JSON schema"),
]

#: Committed H200 runs (scripts/gpu/run-h200.sh) comparing Tempo9 on CUDA with
#: llama.cpp on CUDA: file, and the file's name in it (None: one-model file).
CUDA_SOURCES = [
    ("bench/results/2026-12-02-gpu-h200-real.compare.jsonl", "smollm2-135m-instruct-q4_1"),
    ("bench/results/2026-12-03-qwen3-family.h200.compare.jsonl", None),
    ("bench/results/2026-12-04-arch30.h200.compare.jsonl", None),
]

MARK = {"pass": "pass", "fail": "**fail**", "not run": "not run"}


def load_results(results_dir=RESULTS):
    """Every results JSON, merged per machine in name order without the suffix:
    `<date>-<machine>.json`, then the same day's `<date>-<machine>-<tag>.json` (runs
    of some files with `--out`), whose rows replace the earlier ones."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json")), key=lambda p: p[:-len(".json")]):
        r = json.load(open(path))
        r["path"] = os.path.relpath(path, ROOT)
        key = (r["machine"], r["kernel_set"], r.get("codegen"))
        runs.setdefault(key, {"meta": r, "files": {}, "paths": []})
        runs[key]["meta"] = r
        runs[key]["paths"].append(r["path"])
        runs[key]["files"].update(r["files"])
    return list(runs.values())


def cuda_cells(root=ROOT):
    """{cuda_key: {"alone": cell, "batched": cell}} from the committed H200 comparisons:
    Tempo9's CUDA generations against llama.cpp's CUDA ones, per prompt identical or
    parted at a near-tie (the comparison script's own definition)."""
    out = {}
    for rel, only in CUDA_SOURCES:
        rows = [json.loads(line) for line in open(os.path.join(root, rel)) if line.strip()]
        by_model = {}
        for r in rows:
            by_model.setdefault(r.get("model", only), []).append(r)
        for model, rs in by_model.items():
            cells = {}
            for kind, a, refs in (("alone", "tempo9_device_alone", ["llama_cuda"]),
                                  ("batched", "tempo9_device_batched", ["llama_cuda_batched", "llama_cuda"])):
                ref = next((b for b in refs if any(r["a"] == a and r["b"] == b for r in rs)), None)
                sel = [r for r in rs if r["a"] == a and r["b"] == ref]
                if not sel:
                    continue
                ident = sum(r["identical"] for r in sel)
                ties = sum(r["diverged_at_near_tie"] for r in sel)
                n = sum(r["of"] for r in sel)
                lp = max(r["max_top1_logprob_diff_common_prefix"] for r in sel)
                status = "pass" if ident + ties == n else "fail"
                reason = "%d/%d identical to %s, %d part at near-ties, %d elsewhere; top-1 within %.2g" % (
                    ident, n, ref.replace("_", " "), ties, n - ident - ties, lp)
                cells[kind] = {"status": status, "reason": reason, "source": rel}
            out[model] = cells
    return out


def md(text):
    """One table-safe line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def cell_text(c):
    return MARK.get(c["status"], c["status"]) if c else "not run"


def render(runs, cuda):
    lines = []
    heads = []
    for run in runs:
        m = run["meta"]
        label = "%s / %s" % (m["kernel_set"], m.get("codegen") or "?")
        heads.append(label)
    lines.append("Runs (CPU, %s): %s." % (
        "one column group each" if len(runs) > 1 else "one machine",
        "; ".join("`%s` on %s (%s, codegen `%s`, %d threads, Tempo9 `%s`, %s): %s" % (
            r["meta"]["kernel_set"], r["meta"]["machine"], r["meta"]["cpu"], r["meta"].get("codegen"),
            r["meta"]["threads"], r["meta"]["tempo9"], r["meta"]["date"],
            ", ".join("[`%s`](../%s)" % (os.path.basename(p), p) for p in r["paths"])) for r in runs)))
    lines.append("")
    cols = ["file", "arch", "kind"]
    for (key, title) in CHECKS:
        for h in heads:
            cols.append(title + (" (%s)" % h if len(runs) > 1 else ""))
    cols += ["CUDA alone (H200)", "CUDA batched (H200)"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for mf in FILES:
        row = ["[`%s`](#%s)" % (mf.name, anchor(mf.name)), "`%s`" % mf.arch, "real" if mf.real else "synthetic"]
        for key, _ in CHECKS:
            for run in runs:
                f = run["files"].get(mf.name)
                row.append(cell_text(f["cells"].get(key)) if f else "not run")
        cc = cuda.get(mf.cuda_key, {}) if mf.cuda_key else {}
        row += [cell_text(cc.get("alone")), cell_text(cc.get("batched"))]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("## Per file")
    lines.append("")
    for mf in FILES:
        lines.append("### %s" % mf.name)
        lines.append("")
        lines.append("`%s` (%s, `%s`): %s." % (mf.file, "real" if mf.real else "synthetic", mf.arch, mf.about))
        lines.append("")
        for note in mf.notes:
            lines.append(note)
            lines.append("")
        for run in runs:
            f = run["files"].get(mf.name)
            m = run["meta"]
            if len(runs) > 1:
                lines.append("On `%s` / `%s` (%s):" % (m["kernel_set"], m.get("codegen"), m["machine"]))
                lines.append("")
            if not f:
                lines.append("- not run: no result for this file in these runs")
                continue
            if f.get("tempo9"):
                lines.append("Run at Tempo9 `%s`:" % f["tempo9"])
                lines.append("")
            for key, title in CHECKS:
                c = f["cells"].get(key)
                if not c:
                    continue
                extra = ""
                src = c.get("numbers", {}).get("fixture")
                if src:
                    cg = c["numbers"].get("codegen")
                    extra = " ([`%s`](../%s), %s)" % (os.path.basename(src), src,
                                                     "codegen `%s`" % cg if cg else "codegen not recorded")
                lines.append("- %s: %s%s%s" % (title, cell_text(c), (" — " + md(c["reason"])) if c["reason"] else "",
                                                extra))
        cc = cuda.get(mf.cuda_key, {}) if mf.cuda_key else {}
        for kind in ("alone", "batched"):
            c = cc.get(kind)
            if c:
                lines.append("- CUDA %s (H200): %s — %s ([`%s`](../%s))" % (
                    kind, cell_text(c), c["reason"], os.path.basename(c["source"]), c["source"]))
        if not cc:
            lines.append("- CUDA: not run (no committed H200 comparison of this file)")
        lines.append("")
    return "\n".join(lines)


def anchor(name):
    """GitHub's heading anchor of `### name`."""
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def page_text(results_dir=RESULTS, root=ROOT):
    with open(PAGE) as f:
        template = f.read()
    runs = load_results(results_dir)
    if not runs:
        raise SystemExit("no results in %s" % results_dir)
    return template.replace("<!-- matrix -->", render(runs, cuda_cells(root)))


def write_page(path):
    text = page_text()
    with open(path, "w") as f:
        f.write(text)
    print("wrote %s" % path)
