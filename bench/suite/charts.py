#!/usr/bin/env python3
"""PNG charts for benchmark-suite results, generated from the result JSON.

    python3 bench/suite/charts.py bench/results/<date>-<scenario>.json [...]

writes <same stem>.png next to each JSON (run.py calls `render` itself).
Each scenario's JSON carries `summary.panels`, a list of

    {"title": str, "unit": str, "better": "lower"|"higher", "log": bool (optional),
     "kind": "range" (default) | "bars",
     "rows": [{"label": str, "engine": str, "points": [{"tag": str, "value": float}, ...]}, ...]}

"range" panels draw, per row (engine, metric), a horizontal bar from the
smallest to the largest point (rounds, context sizes, repetitions ...), with a
dot and a tag for every point, in the style of the published figures; "bars"
panels draw grouped bars, one group per tag. Needs matplotlib
(`pip install matplotlib`).
"""

import json
import os
import sys

COLORS = {"llama.cpp": "#9a9a9a", "Tempo9": "#1f6feb"}


def _color(engine):
    return COLORS.get(engine, "#d9822b")


def _fmt(v, unit):
    if v is None:
        return "—"
    if abs(v) >= 100:
        return "%.0f %s" % (v, unit)
    if abs(v) >= 10:
        return "%.1f %s" % (v, unit)
    return "%.2f %s" % (v, unit)


def _range_panel(ax, p):
    rows = p["rows"]
    unit = p.get("unit", "")
    ys = list(range(len(rows)))[::-1]
    allv = [pt["value"] for r in rows for pt in r["points"] if pt["value"] is not None]
    if not allv:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    vmax = max(allv)
    for y, r in zip(ys, rows):
        vals = [pt["value"] for pt in r["points"] if pt["value"] is not None]
        if not vals:
            ax.text(0, y, "  (no data)", va="center", fontsize=8)
            continue
        lo, hi = min(vals), max(vals)
        c = _color(r.get("engine"))
        width = hi - lo
        if width <= 0:
            width = vmax * 0.004 if not p.get("log") else lo * 0.02
        ax.barh(y, width, left=lo, height=0.5, color=c, alpha=0.55, edgecolor=c)
        for k, pt in enumerate(r["points"]):
            if pt["value"] is None:
                continue
            ax.plot(pt["value"], y, "o", color=c, markersize=5, markeredgecolor="black", markeredgewidth=0.5)
            # alternate tags above / below so that close values stay readable
            ax.annotate(pt["tag"], (pt["value"], y), textcoords="offset points", xytext=(0, 7 if k % 2 == 0 else -13),
                        ha="center", fontsize=7, color="#333333")
        label = _fmt(lo, unit) if lo == hi else "%s – %s" % (_fmt(lo, unit), _fmt(hi, unit))
        ax.annotate(label, (hi, y), textcoords="offset points", xytext=(8, -3), ha="left", fontsize=8,
                    fontweight="bold")
    ax.set_yticks(ys)
    ax.set_yticklabels([r["label"] for r in rows], fontsize=9)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    if p.get("log"):
        ax.set_xscale("log")
        ax.set_xlim(min(allv) / 2, vmax * 4)
    else:
        ax.set_xlim(0, vmax * 1.35 if vmax > 0 else 1)
    ax.set_xlabel(unit)
    ax.grid(axis="x", alpha=0.3)


def _bars_panel(ax, p):
    rows = p["rows"]
    unit = p.get("unit", "")
    tags = []
    for r in rows:
        for pt in r["points"]:
            if pt["tag"] not in tags:
                tags.append(pt["tag"])
    n = max(len(rows), 1)
    w = 0.8 / n
    for i, r in enumerate(rows):
        vals = {pt["tag"]: pt["value"] for pt in r["points"]}
        xs = [t + (i - (n - 1) / 2) * w for t in range(len(tags))]
        hs = [vals.get(tag) or 0 for tag in tags]
        ax.bar(xs, hs, width=w * 0.95, color=_color(r.get("engine")), label=r["label"], alpha=0.85)
        for x, tag in zip(xs, tags):
            v = vals.get(tag)
            ax.annotate(_fmt(v, ""), (x, v or 0), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_xticks(range(len(tags)))
    ax.set_xticklabels(tags)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    top = max([pt["value"] or 0 for r in rows for pt in r["points"]] + [1])
    ax.set_ylim(0, top * 1.2)


def render(result, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (result.get("summary") or {}).get("panels") or []
    if not panels:
        raise ValueError("no panels in result")
    heights = [max(1.6, 0.55 * len(p["rows"]) + 1.2) if p.get("kind", "range") == "range" else 3.2 for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights) + 0.8),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, p in zip(axes[:, 0], panels):
        (_bars_panel if p.get("kind") == "bars" else _range_panel)(ax, p)
        ax.set_title("%s  (%s is better)" % (p["title"], p.get("better", "lower")), fontsize=10, loc="left")
    engines = ", ".join(sorted({r["engine"] for r in result.get("runs", [])})) or "none"
    skipped = "; not measured: " + ", ".join(result["skipped"]) if result.get("skipped") else ""
    fig.suptitle("%s — %s (%s%s)" % (result["scenario"], result["started"][:10], engines, skipped), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        with open(path) as f:
            res = json.load(f)
        out = os.path.splitext(path)[0] + ".png"
        render(res, out)
        print("wrote", out)


if __name__ == "__main__":
    main()
