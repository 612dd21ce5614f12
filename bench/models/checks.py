"""The matrix's checks: each takes a running server (or the engine's tests) and
returns a Cell: pass / fail / not run, a short reason and its numbers."""

import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"

# Near-tie margins of crates/engine/tests/parity.rs (check_batched): random-weight
# files turn rounding into larger log-probability moves than real models do.
TIE_SYNTH, TIE_REAL = 0.15, 0.02
# Decode steps over more than this many cells attend through matmuls, where llama.cpp's
# fixtures used flash attention (tempo9-models' `MATMUL_DECODE_ABOVE`): there the
# parity test takes a parting within TIE_MATMUL of llama.cpp's best as a near-tie
# (TIE_MATMUL_HYBRID for the Qwen3.5 files; crates/engine/tests/parity.rs).
MATMUL_DECODE_ABOVE = 256
TIE_MATMUL, TIE_MATMUL_HYBRID = 0.2, 0.4


def tie_at(case, step, tie, arch, flash_decode=False):
    """The near-tie margin at generation `step` of `case`: `tie`, or the parity
    test's matmul-attention margin on a decode step over more than
    MATMUL_DECODE_ABOVE cells (none with `flash_decode`: the server then attends
    through flash attention at any depth, as the fixtures did)."""
    if not flash_decode and step > 0 and len(case["prompt_ids"]) + step > MATMUL_DECODE_ABOVE:
        return max(tie, TIE_MATMUL_HYBRID if arch.startswith("qwen35") else TIE_MATMUL)
    return tie


@dataclass
class Cell:
    """One check's result on one file."""

    status: str
    reason: str = ""
    numbers: dict = field(default_factory=dict)

    def to_json(self):
        return asdict(self)


def post(base, path, body, timeout):
    """POSTs JSON, returns (status, parsed body)."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {}


def error_text(status, body):
    msg = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("error")
    return "HTTP %d: %s" % (status, str(msg)[:200])


# ---------------------------------------------------------------- greedy parity

def complete_ids(base, ids, timeout):
    """64 greedy tokens after the prompt ids through /v1/completions, with the top 2
    log-probabilities of each step (the fixture request's equivalent)."""
    status, body = post(base, "/v1/completions", {
        "model": "m", "prompt": ids, "max_tokens": 64, "temperature": 0, "logprobs": 2,
    }, timeout)
    if status != 200:
        raise RuntimeError(error_text(status, body))
    ch = body["choices"][0]
    lp = ch["logprobs"]
    return {"text": ch["text"], "finish": ch["finish_reason"], "pieces": lp["tokens"],
            "logprobs": lp["token_logprobs"],
            "tops": [sorted(t.values(), reverse=True) for t in lp["top_logprobs"]],
            "n": body["usage"]["completion_tokens"]}


SPECIAL_PIECE = re.compile(r"<[^<>\s]+>")


def pieces_pattern(pieces):
    """A regex of the text the pieces spell. The API gives each token's text with an
    incomplete UTF-8 sequence (a character split over tokens) as U+FFFD, so each
    U+FFFD stands for at most one character of the whole text; and it names a
    control token (`<|reserved_special_token_56|>`) whose text neither engine's
    response text holds, so such a piece may spell nothing."""
    out = []
    for p in pieces:
        piece = "".join("(?:.|)" if ch == "\ufffd" else re.escape(ch) for ch in p)
        out.append("(?:%s|)" % piece if SPECIAL_PIECE.fullmatch(p) else piece)
    return "".join(out)


def first_diff_step(pieces, want_text):
    """The generation step where our pieces stop spelling the fixture's text."""
    for i in range(len(pieces)):
        if not re.match(pieces_pattern(pieces[:i + 1]), want_text, re.S):
            return i
    return len(pieces)


def compare_case(case, got):
    """(identical?, detail) of one generation against one fixture case: the same
    number of tokens, and our tokens' pieces spell llama.cpp's text (the tokens,
    not the response text, which is checked on its own by text_difference). The
    server stops at an end-of-generation token where llama.cpp's `ignore_eos`
    masked it, so a generation ending with that token at the fixture's first masked step
    counts as identical (the steps after it are llama.cpp's with the token forbidden)."""
    want = case["text"]
    masked = case.get("argmax_mismatch_steps") or []
    pattern = pieces_pattern(got["pieces"])
    if got["n"] == len(case["tokens"]) and re.fullmatch(pattern, want, re.S):
        return True, None
    # The end-of-generation token itself is counted, and named by the last piece.
    ended = got["pieces"] and SPECIAL_PIECE.fullmatch(got["pieces"][-1])
    if got["finish"] == "stop" and masked and got["n"] - (1 if ended else 0) == masked[0] \
            and re.match(pattern, want, re.S):
        return True, None
    step = first_diff_step(got["pieces"], want)
    top = case["top"][step] if step < len(case["top"]) else None
    gap = round(top[0][1] - top[1][1], 4) if top and len(top) > 1 else None
    return False, {"case": case["name"], "step": step, "llama_gap": gap}


def text_difference(case, got):
    """Where the response text differs from llama.cpp's although the tokens agree:
    {case, char offset, ours, llama.cpp's} or None."""
    ours, want = got["text"], case["text"]
    if ours == want or (got["finish"] == "stop" and want.startswith(ours)):
        return None
    k = next((i for i, (a, b) in enumerate(zip(ours, want)) if a != b), min(len(ours), len(want)))
    return {"case": case["name"], "char": k, "ours": ours[max(0, k - 4):k + 6], "llama": want[max(0, k - 4):k + 6]}


def max_logprob_diff(case, got):
    """Largest |top-1 log-probability| difference over the steps both agree on."""
    same = first_diff_step(got["pieces"], case["text"])
    diffs = [abs(got["logprobs"][i] - case["top"][i][0][1])
             for i in range(min(same, len(got["logprobs"]), len(case["top"])))
             if case["top"][i] is not None and got["logprobs"][i] is not None]
    return max(diffs) if diffs else 0.0


def greedy_alone(base, fixture, tie, timeout, arch="", flash_decode=False):
    """Every fixture case alone; pass when every generation is llama.cpp's or parts
    from it only where llama.cpp's own top-2 margin is under `tie`, or on a
    matmul-attention decode step under the parity test's margin there (`tie_at`;
    `arch`: the file's architecture; `flash_decode`: served with --flash-decode)."""
    outs, parted, texts, lp = [], [], [], 0.0
    for case in fixture["cases"]:
        got = complete_ids(base, case["prompt_ids"], timeout)
        outs.append(got)
        ok, detail = compare_case(case, got)
        if not ok:
            parted.append(detail)
        elif text_difference(case, got):
            texts.append(text_difference(case, got))
        lp = max(lp, max_logprob_diff(case, got))
    n = len(fixture["cases"])
    by_name = {c["name"]: c for c in fixture["cases"]}
    ties = [p for p in parted if p["llama_gap"] is not None
            and p["llama_gap"] < tie_at(by_name[p["case"]], p["step"], tie, arch, flash_decode)]
    bad = [p for p in parted if p not in ties]
    nums = {"identical": n - len(parted), "of": n, "max_top1_logprob_diff": round(lp, 5),
            "near_ties": ties, "parted": bad, "tie_margin": tie, "text_differs": texts}
    reason = "%d/%d identical to llama.cpp" % (n - len(parted), n)
    if ties:
        reason += ", %d part at near-ties (%s)" % (len(ties), ", ".join(
            "`%s` step %d, gap %s" % (p["case"], p["step"], p["llama_gap"]) for p in ties[:3]))
    if bad:
        reason += "; " + ", ".join("`%s` parts at step %d (llama.cpp's top-2 gap %s)"
                                   % (p["case"], p["step"], p["llama_gap"]) for p in bad[:3])
    reason += "; top-1 log-probabilities within %.2g on the common steps" % lp
    if texts:
        t = texts[0]
        reason += ("; in %d case(s) of equal tokens the response text differs from llama.cpp's "
                   "(`%s` at char %d: %r, llama.cpp %r)" % (len(texts), t["case"], t["char"], t["ours"], t["llama"]))
    return Cell(PASS if not bad else FAIL, reason, nums), outs


def greedy_batched(base, fixture, alone, tie, timeout):
    """The cases four at a time, concurrently: each stream must equal its alone run
    or part from it where the alone run's top-2 margin is under `tie`."""
    cases = fixture["cases"]
    outs = [None] * len(cases)
    errors = []

    def one(i):
        try:
            outs[i] = complete_ids(base, cases[i]["prompt_ids"], timeout)
        except Exception as e:  # recorded as the cell's failure
            errors.append("%s: %s" % (cases[i]["name"], e))

    for start in range(0, len(cases), 4):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(start, min(start + 4, len(cases)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        return Cell(FAIL, "; ".join(errors[:3]))
    same, ties, bad = 0, [], []
    for i, (a, b) in enumerate(zip(alone, outs)):
        if a["pieces"] == b["pieces"] and a["n"] == b["n"]:
            same += 1
            continue
        step = first_diff_step(b["pieces"], "".join(a["pieces"]))
        tops = a["tops"][step] if step < len(a["tops"]) else []
        margin = round(tops[0] - tops[1], 4) if len(tops) > 1 else None
        (ties if margin is not None and margin < tie else bad).append(
            {"case": cases[i]["name"], "step": step, "margin": margin})
    identical_llama = sum(compare_case(c, o)[0] for c, o in zip(cases, outs))
    nums = {"same_as_alone": same, "of": len(cases), "near_ties": ties, "parted": bad,
            "identical_to_llama": identical_llama, "tie_margin": tie}
    reason = "%d/%d identical to alone (%d/%d to llama.cpp)" % (same, len(cases), identical_llama, len(cases))
    if ties:
        reason += ", %d part at near-ties (< %g)" % (len(ties), tie)
    if bad:
        reason += "; " + ", ".join("`%s` parts at step %d (margin %s)" % (p["case"], p["step"], p["margin"])
                                   for p in bad[:3])
    return Cell(PASS if not bad else FAIL, reason, nums)


# ---------------------------------------------------------------- chat

def chat(client, **kw):
    return client.chat.completions.create(model="m", **kw)


def chat_check(client):
    """A system + user conversation through the file's chat template."""
    r = chat(client, messages=[{"role": "system", "content": "You are concise."},
                               {"role": "user", "content": "What is the capital of France?"}],
             max_tokens=16, temperature=0)
    ch = r.choices[0]
    text = ch.message.content or ""
    if r.usage.prompt_tokens <= 0 or ch.finish_reason not in ("stop", "length"):
        return Cell(FAIL, "finish %s, %d prompt tokens" % (ch.finish_reason, r.usage.prompt_tokens))
    return Cell(PASS, "%d prompt tokens, %d generated (finish %s)" % (
        r.usage.prompt_tokens, r.usage.completion_tokens, ch.finish_reason),
        {"prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens,
         "text": text})


def long_prompt_text(n_lines):
    """A deterministic document of distinct lines (no repeated n-grams to exploit)."""
    words = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "iris",
             "juniper", "kelp", "lagoon", "meadow", "nectar", "orchid", "pebble", "quartz", "river"]
    lines = []
    for i in range(n_lines):
        a, b, c = words[i % 18], words[(i * 7) % 18], words[(i * 13 + 5) % 18]
        lines.append("Entry %d: the %s near the %s holds %d %s stones." % (i, a, b, (i * 37) % 1000, c))
    return "\n".join(lines)


def long_prompt_check(client, max_context, budget_s, target=10000):
    """A ~10K-token prompt answered, then the same prompt again: the repeat must
    report its prefix as cached tokens and give the same greedy answer."""
    if max_context < target + 512:
        return Cell(NOT_RUN, "the model's context is %d tokens" % max_context, {"max_context": max_context})
    text = long_prompt_text(int(target / 17.5))
    msgs = [{"role": "user", "content": text + "\n\nWhich stones does entry 42 hold?"}]
    import openai

    t0 = time.time()
    try:
        r1 = chat(client, messages=msgs, max_tokens=8, temperature=0, timeout=budget_s)
        t1 = time.time()
        r2 = chat(client, messages=msgs, max_tokens=8, temperature=0, timeout=budget_s)
        t2 = time.time()
    except openai.APITimeoutError:
        return Cell(NOT_RUN, "a request took over the %.0f s budget (`--budget`)" % budget_s)
    p = r1.usage.prompt_tokens
    cached = (r2.usage.prompt_tokens_details.cached_tokens or 0) if r2.usage.prompt_tokens_details else 0
    nums = {"prompt_tokens": p, "cached_tokens": cached, "first_s": round(t1 - t0, 1),
            "repeat_s": round(t2 - t1, 1)}
    same = r1.choices[0].message.content == r2.choices[0].message.content
    reason = "%d prompt tokens in %.0f s; repeat: %d cached, %.1f s" % (p, t1 - t0, cached, t2 - t1)
    if p < target * 0.9:
        return Cell(FAIL, reason + " (prompt shorter than intended)", nums)
    if cached < p - 128:
        return Cell(FAIL, reason + " (prefix not served from the cache)", nums)
    if not same:
        return Cell(FAIL, reason + " (repeat answered differently)", nums)
    return Cell(PASS, reason + ", same answer", nums)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}


def tool_check(client):
    """tool_choice "required": the grammar makes the model start the family's own
    tool-call markup, the family's parser returns it as `tool_calls`; the tool's
    result then goes back in a second request that must be answered."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = chat(client, messages=msgs, tools=[WEATHER_TOOL], tool_choice="required",
             max_tokens=256, temperature=0)
    m = r.choices[0].message
    if not m.tool_calls:
        # Still check the way back: a client-made call and its result through the template.
        back = [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp": 21})}]
        try:
            r2 = chat(client, messages=msgs + back, tools=[WEATHER_TOOL], max_tokens=16, temperature=0)
            after = "a client-made call's result sent back was answered (%d prompt tokens)" % r2.usage.prompt_tokens
        except Exception as e:  # part of this cell's reason
            after = "a client-made call's result sent back failed: %s" % str(e)[:120]
        reasoning = getattr(m, "reasoning_content", None) or ""
        return Cell(FAIL, "tool_choice required gave no tool call in 256 tokens (finish %s, %d characters of "
                    "content, %d of reasoning); %s" % (r.choices[0].finish_reason, len(m.content or ""),
                                                       len(reasoning), after),
                    {"content": (m.content or "")[:200], "reasoning": reasoning[:200]})
    call = m.tool_calls[0]
    try:
        args = json.loads(call.function.arguments)
    except ValueError:
        return Cell(FAIL, "arguments are not JSON: %r" % call.function.arguments[:80])
    if call.function.name != "get_weather" or set(args) != {"city", "unit"}:
        return Cell(FAIL, "call %s(%s) does not fit the tool" % (call.function.name, call.function.arguments))
    msgs += [{"role": "assistant", "content": m.content, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21, "sky": "clear"})}]
    r2 = chat(client, messages=msgs, tools=[WEATHER_TOOL], max_tokens=16, temperature=0)
    return Cell(PASS, "get_weather(%s); the result sent back was answered (%d prompt tokens, finish %s)"
                % (call.function.arguments, r2.usage.prompt_tokens, r2.choices[0].finish_reason),
                {"arguments": args, "second_prompt_tokens": r2.usage.prompt_tokens})


ANSWER_SCHEMA = {"type": "object", "properties": {
    "answer": {"type": "string", "enum": ["yes", "no", "unsure"]},
    "sure": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["geo", "math", "misc"]}, "maxItems": 3}},
    "required": ["answer", "sure", "tags"], "additionalProperties": False}


def schema_check(client):
    """response_format json_schema: the output must validate."""
    import jsonschema

    r = chat(client, messages=[{"role": "user", "content": "Is Paris in France? Answer in JSON."}],
             response_format={"type": "json_schema", "json_schema": {
                 "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}},
             max_tokens=128, temperature=0)
    text = r.choices[0].message.content or ""
    try:
        value = json.loads(text)
        jsonschema.validate(value, ANSWER_SCHEMA)
    except (ValueError, jsonschema.ValidationError) as e:
        return Cell(FAIL, "finish %s, %s: %r" % (r.choices[0].finish_reason, str(e).splitlines()[0][:80], text[:80]))
    return Cell(PASS, "valid: %s" % json.dumps(value), {"value": value})
