"""Requests shaped like the ones real coding agents send (recorded by
bench/agents/proxy.py from Claude Code 2.1.332, Codex CLI 0.171.0, OpenClaw
2026.9.6 and opencode 1.18.33), on Qwen2.5-Coder-0.5B: the fields they add are accepted, deferred
tools are not shown to the model, and a second agent turn that repeats the
first turn's system prompt and tools is served from the prefix cache even when
the client's volatile billing line changes."""

import copy
import json
import os

import anthropic
import httpx
import pytest

from conftest import SMOL, Server

STABLE = ("You are an agent working with the user toward their goals, using your own judgment. "
          "Text you output outside of tool use is displayed to the user as markdown. ") * 8
READ = {"name": "Read", "description": "Reads a file from the local filesystem.",
        "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string", "description": "The absolute path to the file to read"}},
            "required": ["file_path"]}}
PLACEHOLDER = {"name": "DeferredToolPlaceholder",
               "description": "Reserved placeholder that keeps deferred tool loading active; never call this tool.",
               "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}


def claude_code_body(model, billing, messages):
    """The shape of Claude Code's /v1/messages?beta=true body."""
    return {
        "model": model, "max_tokens": 24, "stream": False, "temperature": 0,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.%s; cc_entrypoint=sdk-cli;" % billing},
                   {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": STABLE, "cache_control": {"type": "ephemeral"}}],
        "tools": [PLACEHOLDER, READ],
        "messages": messages,
        "metadata": {"user_id": "{\"device_id\":\"x\",\"session_id\":\"y\"}"},
        "thinking": {"type": "adaptive", "display": "updates"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }


FIRST = [
    {"role": "user", "content": "Use a tool to read the file hello.txt, then tell me its first line."},
    {"role": "system", "content": [{"type": "text", "text": "# Environment\n - Primary working directory: /tmp/w\n\nToday's date is 2026-11-30.",
                                    "cache_control": {"type": "ephemeral"}}]},
]


def test_claude_code_turns_are_cached_and_deferred_tools_hidden(qwen):
    c = anthropic.Anthropic(base_url=qwen.base, api_key="dummy", max_retries=0, timeout=300)
    post = lambda body: httpx.post(qwen.base + "/v1/messages?beta=true", json=body, timeout=300,
                                   headers={"anthropic-version": "2023-06-01", "x-api-key": "dummy"})
    # The deferred placeholder is not rendered: counting with or without it agrees.
    body = claude_code_body(qwen.name, "461", FIRST)
    n_with = c.messages.count_tokens(model=qwen.name, system=body["system"], tools=[PLACEHOLDER, READ],
                                     messages=FIRST).input_tokens
    n_without = c.messages.count_tokens(model=qwen.name, system=body["system"], tools=[READ],
                                        messages=FIRST).input_tokens
    assert n_with == n_without
    r1 = post(body)
    assert r1.status_code == 200, r1.text
    u1 = r1.json()["usage"]
    prompt1 = u1["input_tokens"] + u1["cache_read_input_tokens"]
    # Turn 2: a different billing line (it changes per request), the same system
    # prompt and tools, the previous turn and a tool result appended.
    second = FIRST + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "/tmp/w/hello.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "1\tThe secret word is pelican.",
                                      "cache_control": {"type": "ephemeral"}}]},
    ]
    body2 = claude_code_body(qwen.name, "9f3", second)
    body2["stream"] = True
    events = []
    with httpx.stream("POST", qwen.base + "/v1/messages?beta=true", json=body2, timeout=300,
                      headers={"anthropic-version": "2023-06-01", "x-api-key": "dummy"}) as r2:
        assert r2.status_code == 200
        for line in r2.iter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
            if line.startswith("data: ") and '"message_delta"' in line:
                u2 = json.loads(line[6:])["usage"]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    # Everything up to the end of turn 1's prompt (whole KV pages) is reused.
    assert u2["cache_read_input_tokens"] >= prompt1 - 192
    assert u2["cache_read_input_tokens"] > 0 and u2["input_tokens"] > 0


def codex_body(model, items, stream):
    """The shape of Codex CLI's /v1/responses body (custom provider, wire_api "responses")."""
    return {
        "model": model, "stream": stream, "instructions": None, "input": items,
        "tools": [{"type": "function", "name": "exec_command", "description": "Runs a command in a PTY.",
                   "strict": False, "parameters": {"type": "object", "properties": {
                       "cmd": {"type": "string", "description": "Shell command to execute."}},
                       "required": ["cmd"], "additionalProperties": False}},
                  {"type": "namespace", "name": "multi_agent_v1", "tools": []},
                  {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
        "store": False, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a22d41-e3bb-72e0-b943-cf125336c971",
        "client_metadata": {"x-codex-turn-metadata": "{\"turn_id\":\"t\"}"},
        "max_output_tokens": 24, "temperature": 0,
    }


def test_codex_turns_are_cached(qwen):
    dev = {"type": "message", "role": "developer",
           "content": [{"type": "input_text", "text": "You are a coding agent running in the Codex CLI. " + STABLE}]}
    user = {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Use a tool to read the file hello.txt, then tell me its first line."}]}
    r1 = httpx.post(qwen.base + "/v1/responses", json=codex_body(qwen.name, [dev, user], False), timeout=300)
    assert r1.status_code == 200, r1.text
    prompt1 = r1.json()["usage"]["input_tokens"]
    items = [dev, user,
             {"type": "reasoning", "summary": [], "encrypted_content": None},
             {"type": "function_call", "call_id": "call_1", "name": "exec_command",
              "arguments": "{\"cmd\":\"cat hello.txt\"}"},
             {"type": "function_call_output", "call_id": "call_1",
              "output": "Chunk ID: 1\nOutput:\nThe secret word is pelican.\n"}]
    events, usage = [], None
    with httpx.stream("POST", qwen.base + "/v1/responses", json=codex_body(qwen.name, items, True),
                      timeout=300) as r2:
        assert r2.status_code == 200
        for line in r2.iter_lines():
            if line.startswith("data: "):
                d = json.loads(line[6:])
                events.append(d["type"])
                if d["type"] in ("response.completed", "response.incomplete"):
                    usage = d["response"]["usage"]
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete")
    assert usage["input_tokens_details"]["cached_tokens"] >= prompt1 - 192 > 0


CODEX_DEFAULT_TOOLS = {
    # Codex 0.171's request for its own default models: no `tools`, but an
    # `additional_tools` input item with namespaces and a free-form `exec` tool
    # (bench/agents/logs/2026-12-04/codex/requests.jsonl, shortened).
    "type": "additional_tools", "role": "developer", "tools": [
        {"type": "namespace", "name": "functions", "description": "", "tools": [
            {"type": "custom", "name": "exec", "description": "Run JavaScript code to orchestrate tool calls.",
             "format": {"type": "grammar", "syntax": "lark",
                        "definition": "start: plain_source\nplain_source: SOURCE\nSOURCE: /[\\s\\S]+/\n"}},
            {"type": "function", "name": "wait", "description": "Wait for a running exec cell.", "strict": False,
             "parameters": {"type": "object", "properties": {"cell_id": {"type": "string"}}, "required": ["cell_id"]}}]},
        {"type": "namespace", "name": "clock", "description": "Time tools.", "tools": [
            {"type": "function", "name": "sleep", "description": "Sleep.", "strict": False,
             "parameters": {"type": "object", "properties": {"ms": {"type": "integer"}}}}]}]}


def test_codex_default_model_tools_are_offered_and_called(qwen):
    """The free-form `exec` and namespaced tools reach the model; a call of `exec`
    comes back as a `custom_tool_call` with text input, and the next turn, which
    carries that call and its `custom_tool_call_output`, is answered from cache."""
    user = {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "List the files in the current directory."}]}
    body = {"model": qwen.name, "stream": True, "input": [CODEX_DEFAULT_TOOLS, user],
            "tool_choice": {"type": "custom", "name": "exec"}, "parallel_tool_calls": False,
            "store": False, "max_output_tokens": 48, "temperature": 0}
    events, items, usage = [], [], None
    with httpx.stream("POST", qwen.base + "/v1/responses", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                d = json.loads(line[6:])
                events.append(d["type"])
                if d["type"] == "response.output_item.done":
                    items.append(d["item"])
                if d["type"] in ("response.completed", "response.incomplete"):
                    usage = d["response"]["usage"]
    calls = [i for i in items if i["type"] == "custom_tool_call"]
    assert len(calls) == 1, items
    assert calls[0]["name"] == "exec" and isinstance(calls[0]["input"], str) and calls[0]["input"]
    assert "response.custom_tool_call_input.done" in events
    assert not any(i["type"] == "function_call" for i in items)
    # Turn 2: the call and its output in the history.
    body2 = dict(body, stream=False, tool_choice="auto", input=[
        CODEX_DEFAULT_TOOLS, user,
        {"type": "custom_tool_call", "call_id": calls[0]["call_id"], "name": "exec", "input": calls[0]["input"]},
        {"type": "custom_tool_call_output", "call_id": calls[0]["call_id"], "output": "hello.txt\nnotes.md"}])
    r2 = httpx.post(qwen.base + "/v1/responses", json=body2, timeout=300)
    assert r2.status_code == 200, r2.text
    assert r2.json()["usage"]["input_tokens_details"]["cached_tokens"] >= usage["input_tokens"] - 192 > 0
    # A namespaced function, named as Codex names it, is called with its namespace.
    body3 = dict(body, stream=False, tool_choice={"type": "function", "namespace": "clock", "name": "sleep"})
    out = httpx.post(qwen.base + "/v1/responses", json=body3, timeout=300).json()["output"]
    fc = [o for o in out if o["type"] == "function_call"]
    assert fc and fc[0]["name"] == "sleep" and fc[0]["namespace"] == "clock", out
    json.loads(fc[0]["arguments"])


@pytest.fixture(scope="module")
def smol_keepalive():
    """SmolLM2 with keep-alive events every 20 ms (instead of 15 s)."""
    os.environ["TEMPO9_KEEPALIVE_MS"] = "20"
    try:
        s = Server(SMOL, [])
    finally:
        del os.environ["TEMPO9_KEEPALIVE_MS"]
    yield s
    s.stop()


def test_streams_send_keepalives_during_long_prefill(smol_keepalive):
    srv = smol_keepalive
    long_text = "The quick brown fox jumps over the lazy dog. " * 300
    body = {"model": srv.name, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": long_text + "Say hi."}]}
    with httpx.stream("POST", srv.base + "/v1/messages", json=body, timeout=300) as r:
        names = [l[7:] for l in r.iter_lines() if l.startswith("event: ")]
    first_block = names.index("content_block_start")
    # message_start, the initial ping, then pings while the prompt is prefilled.
    assert names[0] == "message_start" and names[1:first_block].count("ping") >= 2, names
    assert names[-1] == "message_stop"
    body = {"model": srv.name, "max_output_tokens": 4, "stream": True, "input": long_text + "Say hi!"}
    types = []
    with httpx.stream("POST", srv.base + "/v1/responses", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                types.append(json.loads(line[6:])["type"])
    first_item = types.index("response.output_item.added")
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:first_item].count("response.in_progress") >= 2, types
    assert types[-1] in ("response.completed", "response.incomplete")


AGENT_LOGS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "agents", "logs", "2026-12-04")


def shortened(body, out_tokens=12):
    """A recorded request with its long texts cut (system prompts, user texts, tool
    and parameter descriptions) so that it prefills in seconds on two cores; its
    fields, message and content shapes, tool calls and schemas are kept. Output is
    capped at `out_tokens` in whichever field the client used."""
    b = copy.deepcopy(body)

    def cut_descriptions(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "description" and isinstance(x, str):
                    v[k] = x[:120]
                else:
                    cut_descriptions(x)
        elif isinstance(v, list):
            for x in v:
                cut_descriptions(x)

    for m in b["messages"]:
        c = m.get("content")
        if isinstance(c, str):
            m["content"] = c[:600]
        elif isinstance(c, list):
            for part in c:
                if isinstance(part.get("text"), str):
                    part["text"] = part["text"][:600]
    cut_descriptions(b.get("tools", []))
    for k in ("max_tokens", "max_completion_tokens"):
        if k in b:
            b[k] = out_tokens
    b["temperature"] = 0
    return b


@pytest.mark.parametrize("client", ["opencode", "openclaw-1.5b"])
def test_opencode_and_openclaw_sessions_are_served(qwen, client):
    """Every request of a recorded opencode / OpenClaw session (bench/agents/logs/
    2026-12-04), shortened, replayed in order: each is answered as a stream under the
    made-up model name the client sent (`local`), ends with usage (they ask for it in
    `stream_options`) and a known finish reason; assistant turns with tool calls (with
    text, or with `content: null`), tool results, list-of-parts user turns and a
    history with tool calls but no `tools` all render; and a turn that repeats the
    previous one's system prompt and tools is served from the prefix cache."""
    recs = [json.loads(l) for l in open(os.path.join(AGENT_LOGS, client, "requests.jsonl"))]
    assert len(recs) >= 3
    prev = None
    for i, rec in enumerate(recs):
        body = shortened(rec["request"])
        assert body["model"] == "local" and body["stream"] is True
        chunks, usage, finish = [], None, None
        with httpx.stream("POST", qwen.base + rec["path"], json=body, timeout=600,
                          headers={"User-Agent": rec["request_headers"].get("User-Agent", "")}) as r:
            assert r.status_code == 200, (client, i, r.read())
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                chunks.append(d)
                assert d["object"] == "chat.completion.chunk", d
                for ch in d.get("choices") or []:
                    finish = ch.get("finish_reason") or finish
                usage = d.get("usage") or usage
        assert chunks and usage is not None, (client, i)
        assert finish in ("stop", "length", "tool_calls"), (client, i, finish)
        # The served model answers whatever name the client sends.
        assert {c["model"] for c in chunks} == {qwen.name}, (client, i)
        same_start = prev is not None and prev["messages"][0] == body["messages"][0] \
            and prev.get("tools") == body.get("tools")
        if same_start:
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert cached > 0, (client, i, usage)
        prev = body
