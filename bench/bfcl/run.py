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
for both engines. Requests are sent one at a time, with `logprobs: true` so that
the raw output (markup tokens included) can be read back.

Two scorings of the same answers: "served" (the engine's tool_calls, else its
text, as bfcl reads a response) and "markup" (a call counts only where the model
wrote it as `<tool_call>{...}</tool_call>`, the Qwen2.5/Hermes template's markup,
which is llama.cpp's rule; any other answer is scored as its text). See
`markup_result` and bench/bfcl/README.md.

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
MODEL_NAME = "tempo9-bench-fc"  # bfcl-internal registry name of the model under test
TEXT_CALL = re.compile(r'^\s*(```[A-Za-z]*\s*)?\{\s*"name"\s*:')
# Models this runner knows besides engines.MODELS (kept here so that the suite's
# calibrate.py, which walks every key of engines.MODELS, is unchanged).
EXTRA_MODELS = {
    "qwen1.5b": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                 "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (32K trained context)"),
}
# The tool-call markup of the chat template (Qwen2.5 / Hermes): what the "markup"
# scoring counts as a call.
MARKUP_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
EOG_TAIL = re.compile(r"(<\|(im_end|endoftext)\|>\s*)+$")


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


def raw_output(api_response):
    """The generated text as the model wrote it, markup tokens included: the
    concatenated bytes of `choices[0].logprobs.content` (each entry is one sampled
    token; both engines give a token's text with its special/markup text). None
    when the response has no logprobs."""
    lp = getattr(api_response.choices[0], "logprobs", None)
    content = getattr(lp, "content", None) if lp is not None else None
    if not content:
        return None
    b = bytearray()
    for t in content:
        b += bytes(t.bytes) if t.bytes is not None else t.token.encode()
    return b.decode("utf-8", "replace")


def markup_result(served, raw):
    """The answer under the markup rule (llama.cpp's for this template): calls are
    only the `<tool_call>{...}</tool_call>` bodies of the raw output, each a JSON
    object with "name" and "arguments"; with none of those, the answer is its text
    (the raw output with the markup removed), as the checker then sees it.
    Returns (result, kind): kind "calls" (all served calls were in markup, the
    served result is kept), "markup-reparsed" (calls rebuilt from the markup
    bodies because the served calls differ from them), "text" (served as text,
    kept), "demoted" (served as calls, but none was in markup: now text), or
    "no-raw" (no raw output recorded: the served result is kept)."""
    if raw is None or (isinstance(served, str) and served.startswith("Error during inference")):
        return served, "no-raw"
    calls = []
    for body in MARKUP_CALL.findall(raw):
        try:
            obj = json.loads(body.strip())
            name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a body the template's JSON form does not decode is no call
        calls.append({name: args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)})
    if not calls:
        if isinstance(served, str):
            return served, "text"
        # the message text: the raw output less markup and the end-of-turn token
        # (Tempo9's logprobs list it, llama.cpp's do not)
        return EOG_TAIL.sub("", MARKUP_CALL.sub("", raw)).strip(), "demoted"
    if isinstance(served, list) and [list(c) for c in served] == [list(c) for c in calls] and all(
            json.loads(list(a.values())[0]) == json.loads(list(b.values())[0]) for a, b in zip(served, calls)):
        return served, "calls"
    return calls, "markup-reparsed"


def make_handler(Handler, base, max_tokens, raw=True):
    class Handler_(Handler):
        last_raw = None

        def _query_FC(self, inference_data):
            message = inference_data["message"]
            tools = inference_data["tools"]
            inference_data["inference_input_log"] = {"message": repr(message), "tools": tools}
            kwargs = {"messages": message, "model": self.model_name, "temperature": self.temperature,
                      "store": False, "max_tokens": max_tokens}
            if raw:
                # Only to read back the raw output (markup scoring); at temperature 0
                # the sampled tokens are the argmax either way.
                kwargs["logprobs"] = True
            if len(tools) > 0:
                kwargs["tools"] = tools
            self.last_raw = None
            return self.generate_with_backoff(**kwargs)

        def _parse_query_response_FC(self, api_response):
            self.last_raw = raw_output(api_response)
            self.last_finish = api_response.choices[0].finish_reason
            return super()._parse_query_response_FC(api_response)

    os.environ["OPENAI_BASE_URL"] = base + "/v1"
    os.environ["OPENAI_API_KEY"] = "none"
    h = Handler_(model_name="model", temperature=0.0, registry_name=MODEL_NAME, is_fc_model=True)
    h.client = h.client.with_options(timeout=900, max_retries=0)
    if base != "none":
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
            servers.append((eng, srv, make_handler(Handler, srv.base, args.max_tokens, raw=not args.no_raw)))
            res["engines"].append({"engine": eng.name, "key": eng.key, "describe": eng.describe(),
                                   "startup_s": srv.startup_s, "categories": {}})
        for cat in cats:
            entries, answers, total = data[cat]
            for k, (eng, srv, h) in enumerate(servers):
                res["engines"][k]["categories"][cat] = {"dataset_size": total, "entries": [], "wall_s": 0.0}
        # Category by category, or (--interleave) entry i of every category before
        # entry i+1 of any, so that a run cut short covers every category.
        if args.interleave:
            order = [(cat, i) for i in range(max(len(data[c][0]) for c in cats)) for cat in cats
                     if i < len(data[cat][0])]
        else:
            order = [(cat, i) for cat in cats for i in range(len(data[cat][0]))]
        for cat, i in order:
            entries, answers, total = data[cat]
            e = entries[i]
            for k, (eng, srv, h) in enumerate(servers):
                t = time.time()
                try:
                    result, meta = h.inference(e, include_input_log=False, exclude_state_log=True)
                except Exception as ex:  # noqa: BLE001 (bfcl records failures as results too)
                    result, meta = "Error during inference: %s" % ex, {}
                dt = time.time() - t
                raw = h.last_raw
                r = score(h, cat, e, answers[i] if answers else None, result)
                m_result, kind = markup_result(result, raw)
                rm = r if m_result is result else score(h, cat, e, answers[i] if answers else None, m_result)
                c = res["engines"][k]["categories"][cat]
                c["entries"].append({"id": e["id"], "valid": bool(r["valid"]), "result": result,
                                     "error_type": r.get("error_type"), "error": r.get("error"),
                                     "raw": raw, "finish_reason": getattr(h, "last_finish", None),
                                     "markup_kind": kind, "valid_markup": bool(rm["valid"]),
                                     "markup_result": None if m_result is result else m_result,
                                     "markup_error_type": rm.get("error_type"),
                                     "latency_s": round(dt, 2), "output_tokens": meta.get("output_token_count")})
                c["wall_s"] = round(c["wall_s"] + dt, 1)
                log("%s %s %d/%d %s | markup %s (%s) %.1fs" % (
                    eng.key, cat, i + 1, len(entries), "ok" if r["valid"] else "FAIL " + str(r.get("error_type")),
                    "ok" if rm["valid"] else "FAIL", kind, dt))
            # Summaries after every entry both engines answered: a run cut short
            # reports the first n entries of the sample for each engine.
            for eng_res in res["engines"]:
                summarize(eng_res["categories"][cat], len(entries))
            save()
    finally:
        for _, srv, _ in servers:
            srv.stop()


def summarize(c, sampled):
    c["n"] = len(c["entries"])
    c["correct"] = sum(x["valid"] for x in c["entries"])
    c["accuracy"] = c["correct"] / c["n"] if c["n"] else None
    if c["entries"] and all("valid_markup" in x for x in c["entries"]):
        c["correct_markup"] = sum(x["valid_markup"] for x in c["entries"])
        c["accuracy_markup"] = c["correct_markup"] / c["n"]
    c["complete"] = c["n"] == sampled


def rescore(path):
    """Recomputes the markup scoring of a result file from its stored answers and
    raw outputs (no generation), and rewrites its .json and .md."""
    Handler = install_model_config()
    h = make_handler(Handler, "none", 0)
    res = json.load(open(path))
    cats = res["categories"]
    data = {c: sample(c, res["n"], res["seed"]) for c in cats}
    for eng in res["engines"]:
        for cat, c in eng["categories"].items():
            entries, answers, _ = data[cat]
            by_id = {e["id"]: (e, answers[i] if answers else None) for i, e in enumerate(entries)}
            for x in c["entries"]:
                e, a = by_id[x["id"]]
                m_result, kind = markup_result(x["result"], x.get("raw"))
                rm = score(h, cat, e, a, m_result)
                x.update(markup_kind=kind, valid_markup=bool(rm["valid"]), markup_error_type=rm.get("error_type"),
                         markup_result=None if m_result is x["result"] else m_result)
            summarize(c, len(res["sample_ids"][cat]))
    out = path[:-len(".json")]
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(out + ".md", "w") as f:
        f.write(markdown(res))
    print(markdown(res))


def markdown(res):
    eng = [e["engine"] for e in res["engines"]]
    markup = all("accuracy_markup" in c for e in res["engines"] for c in e["categories"].values() if "n" in c)
    lines = ["# BFCL v4 single-turn sample: %s" % ", ".join(eng), "",
             "Model: %s (`%s`). bfcl-eval %s, official checker. Per category a seeded random sample "
             "(seed %s; column n; the same entries for both engines); temperature 0, one request at a time, "
             "tool_choice auto (server default), via each engine's /v1/chat/completions; runs: %s." % (
                 res["model"], os.path.basename(res["model_path"]), res["bfcl_eval_version"], res["seed"],
                 "; ".join("n %s, max_tokens %s" % (r["n"], r["max_tokens"]) for r in res.get("runs", [res]))),
             "", "Command: `%s`" % res["command"], ""]
    if markup:
        lines += ["Two scorings of the same answers: **served** is the engine's response as bfcl's OpenAI "
                  "handler reads it (the message's `tool_calls`, else its text); **markup** counts a call only "
                  "where the model wrote it in the template's tool-call markup (`<tool_call>{...}</tool_call>`, "
                  "read from the raw output), and scores every other answer as its text (llama.cpp's rule "
                  "for this template).", ""]
        head = " | ".join("%s served | %s markup" % (x, x) for x in eng)
        lines += ["| category | dataset size | n | " + head + " |", "|---|---:|---:|" + "---:|" * 2 * len(eng)]
    else:
        lines += ["| category | dataset size | n | " + " | ".join(eng) + " |", "|---|---:|---:|" + "---:|" * len(eng)]
    tot = {e: [0, 0, 0] for e in eng}
    done = [cat for cat in res["categories"]
            if all("accuracy" in e["categories"].get(cat, {}) for e in res["engines"])]
    for cat in done:
        cells = []
        size = n = None
        for e in res["engines"]:
            c = e["categories"][cat]
            size, n = c["dataset_size"], c["n"]
            cells.append("%.1f%% (%d/%d)" % (100 * c["accuracy"], c["correct"], c["n"]))
            if markup:
                cells.append("%.1f%% (%d/%d)" % (100 * c["accuracy_markup"], c["correct_markup"], c["n"]))
            if not c.get("complete", True):
                size = "%s (first %d of the %d sampled)" % (size, c["n"], len(res["sample_ids"][cat]))
            tot[e["engine"]][0] += c["correct"]
            tot[e["engine"]][1] += c["n"]
            tot[e["engine"]][2] += c.get("correct_markup", 0)
        lines.append("| %s | %s | %s | %s |" % (cat, size, n, " | ".join(cells)))
    cells = []
    for a, b, m in tot.values():
        cells.append("%.1f%% (%d/%d)" % (100 * a / max(b, 1), a, b))
        if markup:
            cells.append("%.1f%% (%d/%d)" % (100 * m / max(b, 1), m, b))
    lines.append("| **all sampled** | | | %s |" % " | ".join(cells))
    if markup:
        # How each answer fared under the markup rule.
        lines += ["", "Answers by where their calls were written (served calls all in `<tool_call>` markup / "
                  "served as calls but none in markup, scored as text under the markup rule / calls rebuilt "
                  "from the markup because the served calls differ / served as text):", "",
                  "| category | " + " | ".join(eng) + " |", "|---|" + "---:|" * len(eng)]
        for cat in done:
            cells = []
            for e in res["engines"]:
                xs = e["categories"][cat]["entries"]
                k = {kind: sum(1 for x in xs if x.get("markup_kind") == kind)
                     for kind in ("calls", "demoted", "markup-reparsed", "text", "no-raw")}
                cells.append("%d / %d / %d / %d%s" % (k["calls"], k["demoted"], k["markup-reparsed"], k["text"],
                                                      " (%d no raw)" % k["no-raw"] if k["no-raw"] else ""))
            lines.append("| %s | %s |" % (cat, " | ".join(cells)))
    if markup and len(eng) == 2:
        # Same generation? The two engines' raw outputs, less the end-of-turn token.
        lines += ["", "Entries whose raw output (the sampled tokens, less the end-of-turn token) is byte-identical "
                  "in both engines, and of those, how many score differently under the served rule:", "",
                  "| category | identical raw output | of which served verdicts differ |", "|---|---:|---:|"]
        for cat in done:
            a, b = (e["categories"][cat]["entries"] for e in res["engines"])
            same = [(x, y) for x, y in zip(a, b) if x.get("raw") is not None and y.get("raw") is not None
                    and EOG_TAIL.sub("", x["raw"]) == EOG_TAIL.sub("", y["raw"])]
            lines.append("| %s | %d/%d | %d |" % (cat, len(same), min(len(a), len(b)),
                                                  sum(1 for x, y in same if x["valid"] != y["valid"])))
    # Diagnostic: answers that came back as message text but hold a call object
    # (`{"name": ...}`, bare or in a ```json block), i.e. calls the engine's
    # parser did not recognise.
    lines += ["", "Answers returned as text that hold a JSON call object (`{\"name\": ...}`, bare or in a "
              "```` ```json ```` block), i.e. the engine did not parse them as tool calls:", "",
              "| category | " + " | ".join(eng) + " |", "|---|" + "---:|" * len(eng)]
    for cat in done:
        cells = []
        for e in res["engines"]:
            c = e["categories"][cat]
            k = sum(1 for x in c["entries"] if isinstance(x["result"], str) and TEXT_CALL.match(x["result"]))
            cells.append("%d/%d" % (k, c["n"]))
        lines.append("| %s | %s |" % (cat, " | ".join(cells)))
    lines += ["", "Wall time per engine: " + ", ".join(
        "%s %.0f s" % (e["engine"], sum(c["wall_s"] for c in e["categories"].values() if "n" in c)) for e in res["engines"])]
    if res.get("findings"):
        lines += ["", "## Findings", "", res["findings"].strip()]
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
    if len(sys.argv) > 1 and sys.argv[1] == "rescore":
        # run.py rescore RESULT.json: the markup scoring again from the stored answers
        return rescore(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="llamacpp,tempo9")
    ap.add_argument("--model", default="qwen",
                    help="a key of engines.MODELS (smollm2 | qwen = Qwen2.5-Coder-0.5B | ...), qwen1.5b "
                         "(Qwen2.5-Coder-1.5B), or a path to a GGUF")
    ap.add_argument("--categories", default=",".join(DEFAULT_CATEGORIES))
    ap.add_argument("--n", type=int, default=20, help="entries per category (seeded random sample)")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads per engine (tempo9 --threads, llama-server -t/-tb); 0 = engine default")
    ap.add_argument("--tempo9-bin", default=os.path.expanduser("~/.cache/tempo9/target/release/tempo9"))
    ap.add_argument("--out", default=None, help="output prefix (default bench/results/<date>-bfcl)")
    ap.add_argument("--interleave", action="store_true",
                    help="ask entry i of every category before entry i+1 of any (a run cut short covers every "
                         "category); default: category by category")
    ap.add_argument("--tempo9-other-tree", action="store_true",
                    help="accept a tempo9 binary built from another checkout (e.g. main's build, for a branch "
                         "that changes only bench/); its `--version` line is recorded in the result")
    ap.add_argument("--no-raw", action="store_true",
                    help="do not ask for logprobs (then there is no raw output and no markup scoring)")
    args = ap.parse_args()

    Handler = install_model_config()
    from engines import MODELS, MODEL_INFO, LlamaCpp, Tempo9

    models_dir = os.environ.get("TEMPO9_MODELS", os.path.expanduser("~/.cache/tempo9/models"))
    if args.model in MODELS:
        model_path = os.path.join(models_dir, MODELS[args.model])
    elif args.model in EXTRA_MODELS:
        model_path = os.path.join(models_dir, EXTRA_MODELS[args.model][0])
        MODEL_INFO[args.model] = EXTRA_MODELS[args.model][1]
    else:
        model_path = args.model
    cats = [c for c in args.categories.split(",") if c]
    data = {c: sample(c, args.n, args.seed) for c in cats}
    if args.tempo9_other_tree:
        Tempo9._check_tree = lambda self: None
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
           "interleave": args.interleave, "logprobs_for_raw": not args.no_raw,
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
