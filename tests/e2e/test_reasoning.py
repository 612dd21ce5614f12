"""Reasoning through every API family's official client, on a real model whose
prompt opens `<think>` (Qwen2.5-Coder with the Qwen3.5 template): with thinking
on, the output starts as reasoning and comes back as reasoning (never as
content), streamed and whole alike; turned off per request, there is none."""

import anthropic
import ollama
import openai

Q = [{"role": "user", "content": "What is 2+2?"}]
N = 8


def no_tags(s):
    return "<think>" not in (s or "") and "</think>" not in (s or "")


def test_openai_chat(qwen_think):
    c = openai.OpenAI(base_url=qwen_think.base + "/v1", api_key="x", max_retries=0)
    kw = dict(model=qwen_think.name, messages=Q, max_tokens=N, temperature=0)
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    reasoning = m.model_extra["reasoning_content"]
    assert reasoning and not m.content and no_tags(reasoning)
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens == N
    streamed, content = "", ""
    for ch in c.chat.completions.create(stream=True, **kw):
        d = ch.choices[0].delta if ch.choices else None
        if d is not None:
            streamed += (d.model_extra or {}).get("reasoning_content") or ""
            content += d.content or ""
    assert streamed == reasoning and content == ""
    for off in ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
                {"reasoning_effort": "none"}):
        m = c.chat.completions.create(**kw, **off).choices[0].message
        assert m.content and "reasoning_content" not in (m.model_extra or {}), off


def test_openai_responses(qwen_think):
    c = openai.OpenAI(base_url=qwen_think.base + "/v1", api_key="x", max_retries=0)
    kw = dict(model=qwen_think.name, input="What is 2+2?", max_output_tokens=N, temperature=0)
    r = c.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning"]
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens == N
    text = r.output[0].content[0].text
    assert text and no_tags(text)
    deltas = [e.delta for e in c.responses.create(stream=True, **kw)
              if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == text
    r = c.responses.create(reasoning={"effort": "none"}, **kw)
    assert [o.type for o in r.output] == ["message"]


def test_anthropic(qwen_think):
    c = anthropic.Anthropic(base_url=qwen_think.base, api_key="x", max_retries=0)
    kw = dict(model=qwen_think.name, messages=Q, max_tokens=N, extra_body={"temperature": 0})
    m = c.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking"]
    assert m.content[0].thinking and no_tags(m.content[0].thinking)
    with c.messages.stream(**kw) as s:
        deltas = [e.delta.thinking for e in s
                  if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]
    assert "".join(deltas) == m.content[0].thinking
    m = c.messages.create(thinking={"type": "disabled"}, **kw)
    assert [b.type for b in m.content] == ["text"]


def test_ollama(qwen_think):
    c = ollama.Client(host=qwen_think.base)
    assert "thinking" in c.show(qwen_think.name).capabilities
    opts = {"temperature": 0, "num_predict": N}
    r = c.chat(model=qwen_think.name, messages=Q, options=opts)
    assert r.message.thinking and not r.message.content and no_tags(r.message.thinking)
    streamed = "".join(p.message.thinking or "" for p in
                       c.chat(model=qwen_think.name, messages=Q, options=opts, stream=True))
    assert streamed == r.message.thinking
    r = c.chat(model=qwen_think.name, messages=Q, options=opts, think=False)
    assert r.message.content and not r.message.thinking


def test_response_format_closes_open_thinking(qwen_think):
    """A constrained answer cannot think first: the open `<think>` is closed in
    the prompt, and the JSON comes back as content."""
    import json

    c = openai.OpenAI(base_url=qwen_think.base + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(
        model=qwen_think.name, max_tokens=30, temperature=0,
        messages=[{"role": "user", "content": "Give me a JSON object with a field answer = 4"}],
        response_format={"type": "json_object"})
    m = r.choices[0].message
    assert isinstance(json.loads(m.content), dict)
    assert "reasoning_content" not in (m.model_extra or {})
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_tool_call_with_a_reasoning_template(qwen3_template):
    """Hermes tool calls under a template that reasons in `<think>` tags: the
    auto tool-call grammar (which lets `<tool_call>` pass while thinking)
    still produces a parsed call, thinking on and off."""
    import json

    c = openai.OpenAI(base_url=qwen3_template.base + "/v1", api_key="x", max_retries=0)
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a given city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris right now?"}]
    for extra in ({}, {"chat_template_kwargs": {"enable_thinking": False}}):
        r = c.chat.completions.create(model=qwen3_template.name, messages=msgs, tools=[weather],
                                      temperature=0, max_tokens=40, extra_body=extra)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", (extra, ch.message)
        call = ch.message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert "paris" in json.loads(call.function.arguments)["city"].lower()
        assert no_tags(ch.message.content)

