"""Tool-call grammars through the server: with tool_choice `required` or a named
function the output is always tool calls to the offered tools whose arguments
are valid against the tool's parameters schema — on Qwen2.5-Coder-0.5B (Hermes
format from its template) and on SmolLM2-135M (no tool syntax in its template:
the server teaches Hermes calls in the system prompt and forces them by
grammar). Invalid parameter schemas are 400s naming the problem."""

import json

import anthropic
import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from conftest import API_KEY

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "book_table", "description": "Book a restaurant table.",
        "parameters": {"type": "object", "properties": {
            "restaurant": {"type": "string", "maxLength": 60},
            "guests": {"type": "integer", "minimum": 1, "maximum": 12},
            "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            "outdoor": {"type": "boolean"}},
            "required": ["restaurant", "guests", "time"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "array", "items": {"type": "string", "maxLength": 60}, "minItems": 1, "maxItems": 3},
            "subject": {"type": "string", "maxLength": 80},
            "priority": {"type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}},
                         "required": ["level"], "additionalProperties": False}},
            "required": ["to", "subject", "priority"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PROMPTS = [
    "What's the weather like in Lisbon?",
    "Please reserve a table for 4 at Luigi's at 19:30, outside if possible.",
    "Email bob@example.com that the meeting moved to Friday; it's urgent.",
    "Tell me a joke about penguins.",
]


def client(srv, key="none"):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=key, max_retries=0, timeout=600)


def check_calls(choice, allowed, max_calls=None):
    # A small model may keep adding parallel calls until max_tokens cuts it:
    # then the complete calls before the cut are returned (and must be valid).
    assert choice.finish_reason == "tool_calls" or (choice.finish_reason == "length" and max_calls is None), choice
    calls = choice.message.tool_calls
    assert calls, choice.message
    if max_calls is not None:
        assert len(calls) <= max_calls
    for c in calls:
        assert c.function.name in allowed, c.function.name
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
    return calls


def forced_calls_are_valid(srv, key):
    c = client(srv, key)
    names = list(SCHEMAS)
    for k, prompt in enumerate(PROMPTS):
        msgs = [{"role": "user", "content": prompt}]
        r = c.chat.completions.create(model=srv.name, messages=msgs, tools=TOOLS, tool_choice="required",
                                      temperature=0, max_tokens=200)
        check_calls(r.choices[0], names)
        # Every tool by name (sampled, not greedy), on two of the prompts.
        for name in names if k in (0, 3) else []:
            r = c.chat.completions.create(model=srv.name, messages=msgs, tools=TOOLS, temperature=0.8, seed=7,
                                          # Every string is bounded by the schema: one call
                                          # always fits in 800 tokens.
                                          max_tokens=800,
                                          tool_choice={"type": "function", "function": {"name": name}})
            check_calls(r.choices[0], [name], max_calls=1)
    # parallel_tool_calls false: exactly one call.
    r = c.chat.completions.create(model=srv.name, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                  temperature=0, max_tokens=200,
                                  messages=[{"role": "user", "content": "Weather in Oslo and in Rome?"}])
    assert len(check_calls(r.choices[0], names)) == 1
    # Streamed: the same calls arrive, each as its id and name, then its arguments
    # in pieces, accumulated as the official client does.
    state = ChatCompletionStreamState()
    chunks = list(c.chat.completions.create(model=srv.name, tools=TOOLS, tool_choice="required", temperature=0,
                                            max_tokens=200, stream=True,
                                            messages=[{"role": "user", "content": PROMPTS[1]}]))
    for ch in chunks:
        state.handle_chunk(ch)
    finish = chunks[-1].choices[0].finish_reason
    calls = state.get_final_completion().choices[0].message.tool_calls
    assert calls and finish in ("tool_calls", "length")
    for i, tc in enumerate(calls):
        args = json.loads(tc.function.arguments)
        # A call cut by max_tokens ends as what was streamed, closed: valid JSON,
        # maybe not valid against its schema.
        if finish == "tool_calls" or i < len(calls) - 1:
            jsonschema.validate(args, SCHEMAS[tc.function.name])


def test_forced_tool_calls_valid_qwen(qwen):
    forced_calls_are_valid(qwen, "none")


def test_forced_tool_calls_valid_smollm2(smol):
    forced_calls_are_valid(smol, API_KEY)


def test_anthropic_any_and_named_tool_inputs_valid(qwen):
    c = anthropic.Anthropic(base_url=qwen.base, api_key="none", max_retries=0, timeout=600)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for choice in ({"type": "any"}, {"type": "tool", "name": "book_table"}):
        m = c.messages.create(model=qwen.name, max_tokens=400, tools=tools, tool_choice=choice,
                              extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": PROMPTS[3]}])
        uses = [b for b in m.content if b.type == "tool_use"]
        # `any` allows parallel calls: the model may add calls until max_tokens.
        ok = ("tool_use", "max_tokens") if choice["type"] == "any" else ("tool_use",)
        assert m.stop_reason in ok and uses, m
        for u in uses:
            jsonschema.validate(u.input, SCHEMAS[u.name])
        if choice["type"] == "tool":
            assert [u.name for u in uses] == ["book_table"]


def test_auto_calls_follow_the_schema(qwen):
    # Auto mode: text or calls; once the model opens <tool_call> the grammar holds.
    c = client(qwen)
    r = c.chat.completions.create(model=qwen.name, tools=TOOLS, temperature=0, max_tokens=200,
                                  messages=[{"role": "user", "content": PROMPTS[0]}])
    ch = r.choices[0]
    if ch.message.tool_calls:
        check_calls(ch, list(SCHEMAS))
    else:
        assert ch.message.content


@pytest.mark.parametrize("params,words", [
    ({"type": "object", "properties": {"x": {"type": "strin"}}}, ["bad_tool", "/properties/x/type"]),
    ({"type": "object", "properties": {"x": {"type": "array", "minItems": -1}}}, ["bad_tool", "minItems"]),
    ({"type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}, ["bad_tool", "/properties/x", "regex"]),
])
def test_invalid_tool_schema_is_a_400_naming_it(qwen, params, words):
    c = client(qwen)
    tools = TOOLS[:1] + [{"type": "function", "function": {"name": "bad_tool", "parameters": params}}]
    for choice in ("required", "auto"):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=qwen.name, tools=tools, tool_choice=choice, max_tokens=8,
                                      messages=[{"role": "user", "content": "hi"}])
        msg = json.dumps(e.value.body)
        for w in words:
            assert w in msg, (w, msg)
