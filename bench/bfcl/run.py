#!/usr/bin/env python3
"""BFCL v4 single-turn categories through an engine's OpenAI /v1/chat/completions,
Tempo9 and llama.cpp side by side on the same GGUF, scored by bfcl-eval's own
checker (AST checker for simple/multiple/parallel/..., relevance logic for the
irrelevance categories).

What comes from bfcl-eval (unchanged): the data (`load_dataset_entry`, with the
language-specific hints the official generation step adds), the request
(`OpenAICompletionsHandler`: tools from `convert_to_tool`, the question as the
messages, tool_choice left to the server default `auto`, `store: false`), the
response parsing and decoding (`_parse_query_response_FC`, `decode_ast`) and the
scoring (`_evaluate_single_ast_entry`, `_evaluate_single_relevance_entry`).
The model entry is registered like bfcl's OpenAI function-calling models
(`is_fc_model=True`, `underscore_to_dot=True`: tool names with '.' are sent
with '_').

What this runner sets: temperature 0 (bfcl's default is 0.001), max_tokens
(default 384; bfcl sends none, which lets a looping 0.5B model run to the
context limit), and the sample: per category a seeded random sample of N
entries (`random.Random(f"{seed}:{category}").sample`, sorted by id), the same
for both engines. Requests are sent one at a time.

Needs: `pip install --no-deps bfcl-eval==2026.3.23` plus tree_sitter==0.21.3,
tree-sitter-java==0.21.0, tree-sitter-javascript==0.21.4, filelock, tenacity,
python-dotenv, tqdm, openai (see bench/bfcl/README.md; the full dependency set of
bfcl-eval pulls torch/vllm/etc. that scoring does not use).
"""

import argparse
import datetime
import json
import os
import random
import re
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench", "suite"))

DEFAULT_CATEGORIES = [
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "irrelevance", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
    "live_irrelevance", "live_relevance",
]
MODEL_NAME = "tempo9-bench-fc"
TEXT_CALL = re.compile(r'^\s*(```[A-Za-z]*\s*)?\{\s*"name"\s*:')  # bfcl-internal registry name of the model under test


def install_model_config():
    """bfcl's model_config module imports every vendor SDK; the checker only needs
    the entry of the model under test, so register a stand-in module first."""
    from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler

    cfg = types.SimpleNamespace(model_name=MODEL_NAME, display_name="OpenAI-compatible FC server",
                                url="", org="", license="", model_handler=OpenAICompletionsHandler,
                                input_price=None, output_price=None, is_fc_model=True,
                                underscore_to_dot=True)
    mod = types.ModuleType("bfcl_eval.constants.model_config")
    mod.MODEL_CONFIG_MAPPING = {MODEL_NAME: cfg}
    mod.ModelConfig = types.SimpleNamespace
    sys.modules["bfcl_eval.constants.model_config"] = mod
    return OpenAICompletionsHandler


def sample(category, n, seed):
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry, is_relevance_or_irrelevance

    entries = load_dataset_entry(category, include_prereq=False, include_language_specific_hint=True)
    total = len(entries)
    rng = random.Random("%s:%s" % (seed, category))
    picked = sorted(rng.sample(range(total), min(n, total)))
    entries = [entries[i] for i in picked]
    answers = None
    if not is_relevance_or_irrelevance(category):
        gt = {a["id"]: a for a in load_ground_truth_entry(category)}
        answers = [gt[e["id"]] for e in entries]
    return entries, answers, total


def make_handler(Handler, base, max_tokens):
    class Handler_(Handler):
        def _query_FC(self, inference_data):
            message = inference_data["message"]
            tools = inference_data["tools"]
            inference_data["inference_input_log"] = {"message": repr(message), "tools": tools}
            kwargs = {"messages": message, "model": self.model_name, "temperature": self.temperature,
                      "store": False, "max_tokens": max_tokens}
            if len(tools) > 0:
                kwargs["tools"] = tools
            return self.generate_with_backoff(**kwargs)

    os.environ["OPENAI_BASE_URL"] = base + "/v1"
    os.environ["OPENAI_API_KEY"] = "none"
    h = Handler_(model_name="model", temperature=0.0, registry_name=MODEL_NAME, is_fc_model=True)
    h.client = h.client.with_options(timeout=900, max_retries=0)
    h.model_name = h.client.models.list().data[0].id  # the name the server serves
    return h


def score(handler, category, entry, answer, result):
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker.eval_runner import _evaluate_single_ast_entry, _evaluate_single_relevance_entry
    from bfcl_eval.utils import is_java, is_js, is_relevance_or_irrelevance

    if is_relevance_or_irrelevance(category):
        return _evaluate_single_relevance_entry(handler, entry["id"], result, entry, MODEL_NAME, category)
    if is_java(category):
        lang, fmt = Language.JAVA, ReturnFormat.JAVA
    elif is_js(category):
        lang, fmt = Language.JAVASCRIPT, ReturnFormat.JAVASCRIPT
    else:
        lang, fmt = Language.PYTHON, ReturnFormat.PYTHON
    return _evaluate_single_ast_entry(handler, entry["id"], result, answer["ground_truth"], entry, MODEL_NAME,
                                      category, language=lang, return_format=fmt, has_tool_call_tag=False)


def run_all(engines, model_path, Handler, cats, data, args, res, save, log):
    """Starts every engine, then for each category and entry asks each engine in
    turn (so a partial run still compares like with like); saves after each
    category."""
    servers = []
    try:
        for eng in engines:
            srv = eng.server(model_path, ctx=args.ctx)
            servers.append((eng, srv, make_handler(Handler, srv.base, args.max_tokens)))
            res["engines"].append({"engine": eng.name, "key": eng.key, "describe": eng.describe(),
                                   "startup_s": srv.startup_s, "categories": {}})
        for cat in cats:
            entries, answers, total = data[cat]
            for k, (eng, srv, h) in enumerate(servers):
                res["engines"][k]["categories"][cat] = {"dataset_size": total, "entries": [], "wall_s": 0.0}
            for i, e in enumerate(entries):
                for k, (eng, srv, h) in enumerate(servers):
                    t = time.time()
                    try:
                        result, meta = h.inference(e, include_input_log=False, exclude_state_log=True)
                    except Exception as ex:  # noqa: BLE001 (bfcl records failures as results too)
                        result, meta = "Error during inference: %s" % ex, {}
                    r = score(h, cat, e, answers[i] if answers else None, result)
                    dt = time.time() - t
                    c = res["engines"][k]["categories"][cat]
                    c["entries"].append({"id": e["id"], "valid": bool(r["valid"]), "result": result,
                                         "error_type": r.get("error_type"), "error": r.get("error"),
                                         "latency_s": round(dt, 2), "output_tokens": meta.get("output_token_count")})
                    c["wall_s"] = round(c["wall_s"] + dt, 1)
                    log("%s %s %d/%d %s %.1fs" % (eng.key, cat, i + 1, len(entries),
                                                 "ok" if r["valid"] else "FAIL " + str(r.get("error_type")), dt))
                # Summaries after every entry both engines answered: a run cut short
                # reports the first n entries of the sample for each engine.
                for eng_res in res["engines"]:
                    c = eng_res["categories"][cat]
                    c["n"] = len(c["entries"])
                    c["correct"] = sum(x["valid"] for x in c["entries"])
                    c["accuracy"] = c["correct"] / c["n"] if c["n"] else None
                    c["complete"] = c["n"] == len(entries)
                save()
    finally:
        for _, srv, _ in servers:
            srv.stop()


def markdown(res):
    eng = [e["engine"] for e in res["engines"]]
    lines = ["# BFCL v4 single-turn sample: %s" % ", ".join(eng), "",
             "Model: %s (`%s`). bfcl-eval %s, official checker. Per category a seeded random sample "
             "(seed %s; column n; the same entries for both engines); temperature 0, one request at a time, "
             "tool_choice auto (server default), via each engine's /v1/chat/completions; runs: %s." % (
                 res["model"], os.path.basename(res["model_path"]), res["bfcl_eval_version"], res["seed"],
                 "; ".join("n %s, max_tokens %s" % (r["n"], r["max_tokens"]) for r in res.get("runs", [res]))),
             "", "Command: `%s`" % res["command"], "",
             "| category | dataset size | n | " + " | ".join(eng) + " |",
             "|---|---:|---:|" + "---:|" * len(eng)]
    tot = {e: [0, 0] for e in eng}
    for cat in res["categories"]:
        if not all("accuracy" in e["categories"].get(cat, {}) for e in res["engines"]):
            continue
        cells = []
        size = n = None
        for e in res["engines"]:
            c = e["categories"][cat]
            size, n = c["dataset_size"], c["n"]
            cells.append("%.1f%% (%d/%d)" % (100 * c["accuracy"], c["correct"], c["n"]))
            if not c.get("complete", True):
                size = "%s (first %d of the %d sampled)" % (size, c["n"], len(res["sample_ids"][cat]))
            tot[e["engine"]][0] += c["correct"]
            tot[e["engine"]][1] += c["n"]
        lines.append("| %s | %s | %s | %s |" % (cat, size, n, " | ".join(cells)))
    lines.append("| **all sampled** | | | %s |" % " | ".join(
        "%.1f%% (%d/%d)" % (100 * a / max(b, 1), a, b) for a, b in tot.values()))
    # Diagnostic: answers that came back as message text but hold a call object
    # (`{"name": ...}`, bare or in a ```json block), i.e. calls the engine's
    # parser did not recognise.
    lines += ["", "Answers returned as text that hold a JSON call object (`{\"name\": ...}`, bare or in a "
              "```` ```json ```` block), i.e. the engine did not parse them as tool calls:", "",
              "| category | " + " | ".join(eng) + " |", "|---|" + "---:|" * len(eng)]
    for cat in res["categories"]:
        if not all("accuracy" in e["categories"].get(cat, {}) for e in res["engines"]):
            continue
        cells = []
        for e in res["engines"]:
            c = e["categories"][cat]
            k = sum(1 for x in c["entries"] if isinstance(x["result"], str) and TEXT_CALL.match(x["result"]))
            cells.append("%d/%d" % (k, c["n"]))
        lines.append("| %s | %s |" % (cat, " | ".join(cells)))
    lines += ["", "Wall time per engine: " + ", ".join(
        "%s %.0f s" % (e["engine"], sum(c["wall_s"] for c in e["categories"].values() if "n" in c)) for e in res["engines"])]
    return "\n".join(lines) + "\n"


def merge(paths, out, order):
    """Joins result files of runs over disjoint categories (same engines, model,
    sample settings) into one, categories in `order`."""
    parts = [json.load(open(p)) for p in paths]
    res = dict(parts[0])
    res["command"] = " ; ".join(p["command"] for p in parts)
    res["merged_from"] = [os.path.basename(p) for p in paths]
    res["engines"] = []
    for k, e in enumerate(parts[0]["engines"]):
        cats = {}
        for p in parts:
            assert p["engines"][k]["engine"] == e["engine"] and p["model_path"] == res["model_path"]
            cats.update({c: v for c, v in p["engines"][k]["categories"].items() if "n" in v})
        res["engines"].append(dict(e, categories=cats))
    done = set.intersection(*(set(e["categories"]) for e in res["engines"]))
    res["categories"] = [c for c in order if c in done]
    # Sample ids from the part whose results are used (later parts win, as above).
    res["sample_ids"] = {}
    for p in parts:
        for c, v in p["engines"][0]["categories"].items():
            if "n" in v and c in done:
                res["sample_ids"][c] = p["sample_ids"][c]
    res["runs"] = [{k: p[k] for k in ("command", "n", "seed", "max_tokens", "threads", "started")} for p in parts]
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(out + ".md", "w") as f:
        f.write(markdown(res))
    print(markdown(res))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "merge":
        # run.py merge OUT_PREFIX A.json B.json ...
        return merge(sys.argv[3:], sys.argv[2], DEFAULT_CATEGORIES)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="llamacpp,tempo9")
    ap.add_argument("--model", default="qwen", help="smollm2 | qwen | path to a GGUF")
    ap.add_argument("--categories", default=",".join(DEFAULT_CATEGORIES))
    ap.add_argument("--n", type=int, default=20, help="entries per category (seeded random sample)")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads per engine (tempo9 --threads, llama-server -t/-tb); 0 = engine default")
    ap.add_argument("--tempo9-bin", default=os.path.expanduser("~/.cache/tempo9/target/release/tempo9"))
    ap.add_argument("--out", default=None, help="output prefix (default bench/results/<date>-bfcl)")
    args = ap.parse_args()

    Handler = install_model_config()
    from engines import MODELS, MODEL_INFO, LlamaCpp, Tempo9

    models_dir = os.environ.get("TEMPO9_MODELS", os.path.expanduser("~/.cache/tempo9/models"))
    model_path = os.path.join(models_dir, MODELS[args.model]) if args.model in MODELS else args.model
    cats = [c for c in args.categories.split(",") if c]
    data = {c: sample(c, args.n, args.seed) for c in cats}
    engines = []
    for k in args.engines.split(","):
        if k == "llamacpp":
            engines.append(LlamaCpp(verbose_log=False, extra="-t %d -tb %d" % (args.threads, args.threads)
                                    if args.threads else ""))
        else:
            engines.append(Tempo9(args.tempo9_bin, extra="--threads %d" % args.threads if args.threads else ""))
    out = args.out or os.path.join(REPO, "bench", "results", "%s-bfcl" % datetime.date.today().isoformat())

    def log(msg):
        print(msg, flush=True)

    from importlib.metadata import version
    res = {"benchmark": "BFCL v4 single-turn (sampled)", "model": MODEL_INFO.get(args.model, args.model),
           "model_path": model_path, "bfcl_eval_version": version("bfcl-eval"), "n": args.n, "seed": args.seed,
           "max_tokens": args.max_tokens, "ctx": args.ctx, "threads": args.threads, "categories": cats,
           "sample_ids": {c: [e["id"] for e in data[c][0]] for c in cats},
           "command": "python3 bench/bfcl/run.py " + " ".join(sys.argv[1:]),
           "started": datetime.datetime.now().isoformat(timespec="seconds"), "engines": []}
    def save():
        with open(out + ".json", "w") as f:
            json.dump(res, f, indent=1, default=str)
        with open(out + ".md", "w") as f:
            f.write(markdown(res))

    run_all(engines, model_path, Handler, cats, data, args, res, save, log)
    print(markdown(res))


if __name__ == "__main__":
    main()
