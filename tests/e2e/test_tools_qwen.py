"""Tool round-trips (call → result → answer) on Qwen2.5-Coder-0.5B through all
three official clients, the Responses API, and prefix caching across agent turns;
streamed calls arriving as a name, then argument pieces, on each streaming API.

The 0.5B model keeps calling the tool when a tool result ends the conversation,
so each round-trip sends the result followed by a short user turn asking for the
answer (as a chat client does when the user follows up)."""

import json

import anthropic
import ollama
import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

SYSTEM = "You are a helpful assistant."
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
ASK = "What is the weather in Paris right now?"
RESULT = "Sunny, 23 degrees Celsius."
FOLLOW_UP = "Now tell me the answer in one sentence."
WRITE_FILE = {"type": "function", "function": {
    "name": "write_file", "description": "Write a text file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}
SQUARES = "Write a Python script squares.py that prints the squares of 1 to 10, one per line."


def oa(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)


def test_openai_tool_round_trip_and_cache(qwen):
    c = oa(qwen)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
    r = c.chat.completions.create(model=qwen.name, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=40)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch.message
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id
    assert "paris" in json.loads(call.function.arguments)["city"].lower()
    msgs += [ch.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": RESULT},
             {"role": "user", "content": FOLLOW_UP}]
    r2 = c.chat.completions.create(model=qwen.name, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=32)
    answer = r2.choices[0].message.content
    assert r2.choices[0].finish_reason in ("stop", "length") and answer
    assert "23" in answer and "sunny" in answer.lower()
    # The second turn repeats the system prompt, tools and first turn: served from the cache.
    assert r2.usage.prompt_tokens_details.cached_tokens >= 128
    assert r2.usage.prompt_tokens_details.cached_tokens < r2.usage.prompt_tokens


def test_openai_streamed_tool_call_and_forced_choice(qwen):
    c = oa(qwen)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
    chunks = list(c.chat.completions.create(model=qwen.name, messages=msgs, tools=[WEATHER], temperature=0,
                                            max_tokens=40, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert "<tool_call>" not in text and calls and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # A named tool_choice forces the call even for an unrelated question.
    r = c.chat.completions.create(model=qwen.name, tools=[WEATHER], temperature=0, max_tokens=32,
                                  messages=[{"role": "user", "content": "Tell me about Rome."}],
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    # tool_choice none: plain text.
    r = c.chat.completions.create(model=qwen.name, messages=msgs, tools=[WEATHER], temperature=0,
                                  max_tokens=16, tool_choice="none")
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")


def test_responses_api_round_trip(qwen):
    c = oa(qwen)
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather of a city.",
              "parameters": WEATHER["function"]["parameters"]}]
    r = c.responses.create(model=qwen.name, instructions=SYSTEM, input=ASK, tools=tools,
                           temperature=0, max_output_tokens=40)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and calls and calls[0].name == "get_weather"
    items = [{"role": "user", "content": ASK},
             {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
              "arguments": calls[0].arguments},
             {"type": "function_call_output", "call_id": calls[0].call_id, "output": RESULT},
             {"role": "user", "content": FOLLOW_UP}]
    events = []
    with c.responses.stream(model=qwen.name, instructions=SYSTEM, input=items, tools=tools,
                            temperature=0, max_output_tokens=40) as s:
        for ev in s:
            events.append(ev.type)
        final = s.get_final_response()
    assert events[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in events and events[-1] in ("response.completed", "response.incomplete")
    assert final.output_text and final.usage.input_tokens_details.cached_tokens > 0


def test_anthropic_tool_round_trip(qwen):
    c = anthropic.Anthropic(base_url=qwen.base, api_key="none", max_retries=0, timeout=300)
    tools = [{"name": "get_weather", "description": "Current weather of a city.",
              "input_schema": WEATHER["function"]["parameters"]}]
    msgs = [{"role": "user", "content": ASK}]
    with c.messages.stream(model=qwen.name, system=SYSTEM, max_tokens=40, extra_body={"temperature": 0}, tools=tools,
                           messages=msgs) as s:
        m = s.get_final_message()
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and "paris" in use.input["city"].lower()
    msgs += [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT},
                                          {"type": "text", "text": FOLLOW_UP}]}]
    m2 = c.messages.create(model=qwen.name, system=SYSTEM, max_tokens=32, extra_body={"temperature": 0}, tools=tools,
                           messages=msgs)
    assert m2.stop_reason in ("end_turn", "max_tokens") and m2.content[0].text
    assert m2.usage.cache_read_input_tokens > 0


def test_ollama_tool_call(qwen):
    c = ollama.Client(host=qwen.base, timeout=300)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
    r = c.chat(model=qwen.name, messages=msgs, tools=[WEATHER], options={"temperature": 0, "num_predict": 40})
    call = r.message.tool_calls[0]
    assert call.function.name == "get_weather" and "paris" in call.function.arguments["city"].lower()
    msgs += [r.message, {"role": "tool", "content": RESULT, "tool_name": "get_weather"},
             {"role": "user", "content": FOLLOW_UP}]
    r2 = c.chat(model=qwen.name, messages=msgs, tools=[WEATHER], options={"temperature": 0, "num_predict": 32})
    assert r2.message.content and r2.done


def test_openai_streams_tool_call_arguments_in_pieces(qwen):
    """A Hermes call streams as OpenAI's do: a first chunk with the call's index,
    id, type and name (arguments ""), then chunks of argument text alone. The
    official client's accumulator makes of them the non-streamed call (greedy).
    The calls are forced (`required`, a named function) so that the model writes
    them in `<tool_call>` tags: in auto mode this 0.5B model answers the weather
    question with a bare JSON object, which is taken as a call only once whole
    (test_openai_streamed_tool_call_and_forced_choice)."""
    c = oa(qwen)
    cases = [
        dict(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
             tools=[WEATHER], max_tokens=40, tool_choice="required"),
        dict(messages=[{"role": "user", "content": SQUARES}], tools=[WRITE_FILE], max_tokens=300,
             tool_choice={"type": "function", "function": {"name": "write_file"}}),
    ]
    for kw in cases:
        r = c.chat.completions.create(model=qwen.name, temperature=0, **kw)
        whole = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and whole, r.choices[0]
        state = ChatCompletionStreamState()
        starts, arg_chunks = [], {}
        for ch in c.chat.completions.create(model=qwen.name, temperature=0, stream=True, **kw):
            state.handle_chunk(ch)
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                if tc.id:
                    assert tc.type == "function" and tc.function.name and tc.function.arguments == "", tc
                    starts.append(tc)
                else:
                    assert tc.function.name is None and tc.type is None, tc
                if tc.function.arguments:
                    arg_chunks[tc.index] = arg_chunks.get(tc.index, 0) + 1
        final = state.get_final_completion().choices[0]
        assert final.finish_reason == "tool_calls"
        streamed = final.message.tool_calls
        assert [(t.function.name, t.function.arguments) for t in streamed] == \
            [(t.function.name, t.function.arguments) for t in whole]
        assert [t.id for t in streamed] == [t.id for t in starts] and all(t.id.startswith("call_") for t in starts)
        # More than one chunk carried each call's arguments.
        assert len(arg_chunks) == len(whole) and min(arg_chunks.values()) > 1, arg_chunks
    assert "\n" in json.loads(whole[0].function.arguments)["content"]


def test_anthropic_and_responses_stream_tool_input_in_pieces(qwen):
    """The same on the Anthropic API (a `tool_use` block opened with `input: {}`,
    then `input_json_delta`s) and the Responses API (`function_call` item added,
    then `function_call_arguments.delta`s, `.done` with them all): the pieces
    make the non-streamed call."""
    a = anthropic.Anthropic(base_url=qwen.base, api_key="none", max_retries=0, timeout=300)
    tools = [{"name": "write_file", "description": "Write a text file.",
              "input_schema": WRITE_FILE["function"]["parameters"]}]
    kw = dict(model=qwen.name, max_tokens=300, extra_body={"temperature": 0}, tools=tools,
              tool_choice={"type": "tool", "name": "write_file"}, messages=[{"role": "user", "content": SQUARES}])
    whole = [b for b in a.messages.create(**kw).content if b.type == "tool_use"]
    assert len(whole) == 1
    partial, starts = [], []
    with a.messages.stream(**kw) as s:
        for ev in s:
            if ev.type == "content_block_start" and ev.content_block.type == "tool_use":
                starts.append(ev.content_block)
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                partial.append(ev.delta.partial_json)
        m = s.get_final_message()
    assert [b.name for b in starts] == ["write_file"] and starts[0].input == {}
    assert len([p for p in partial if p]) > 1 and json.loads("".join(partial)) == whole[0].input
    use = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and [(u.name, u.input) for u in use] == [("write_file", whole[0].input)]

    c = oa(qwen)
    tools = [{"type": "function", "name": "write_file", "description": "Write a text file.",
              "parameters": WRITE_FILE["function"]["parameters"]}]
    kw = dict(model=qwen.name, input=SQUARES, tools=tools, temperature=0, max_output_tokens=300,
              tool_choice={"type": "function", "name": "write_file"})
    whole = [o for o in c.responses.create(**kw).output if o.type == "function_call"]
    assert len(whole) == 1
    added, deltas, done = [], [], []
    for ev in c.responses.create(stream=True, **kw):
        if ev.type == "response.output_item.added" and ev.item.type == "function_call":
            added.append(ev.item)
        elif ev.type == "response.function_call_arguments.delta":
            deltas.append(ev.delta)
        elif ev.type == "response.function_call_arguments.done":
            done.append(ev.arguments)
        elif ev.type == "response.output_item.done" and ev.item.type == "function_call":
            item = ev.item
    assert [i.name for i in added] == ["write_file"] and added[0].arguments == ""
    assert len(deltas) > 1 and done == ["".join(deltas)] == [whole[0].arguments] == [item.arguments]
    assert item.call_id == added[0].call_id and item.id == added[0].id
