"""Anthropic Messages API through the official `anthropic` client."""

import anthropic
import pytest

from conftest import API_KEY


def client(srv, key=API_KEY):
    return anthropic.Anthropic(base_url=srv.base, api_key=key, max_retries=0, timeout=120)


def test_messages_and_stream(smol):
    c = client(smol)
    kw = dict(model=smol.name, max_tokens=12, extra_body={"temperature": 0},
              system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.2.3; cch=abc"},
                      {"type": "text", "text": "You are terse."}],
              messages=[{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}])
    m = c.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    types = []
    with c.messages.stream(**kw) as s:
        for ev in s:
            types.append(ev.type)
        final = s.get_final_message()
    assert final.content[0].text == m.content[0].text
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_start" in types and "content_block_stop" in types and "message_delta" in types
    # The volatile billing line is stripped: counting with a different value gives the same count.
    n1 = c.messages.count_tokens(model=smol.name, system=kw["system"], messages=kw["messages"]).input_tokens
    other = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=9.9.9; cch=zzzzzz"},
             kw["system"][1]]
    n2 = c.messages.count_tokens(model=smol.name, system=other, messages=kw["messages"]).input_tokens
    assert n1 == n2 == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_stop_sequence_and_errors(smol):
    c = client(smol)
    m = c.messages.create(model=smol.name, max_tokens=3, extra_body={"temperature": 0},
                          messages=[{"role": "user", "content": "Count: 1, 2, 3"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    with pytest.raises(anthropic.AuthenticationError):
        client(smol, key="bad").messages.create(model=smol.name, max_tokens=2,
                                                messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError) as e:
        # Another local model's name (a GGUF file beside the served one); any other
        # name is answered by the model served.
        c.messages.create(model="qwen2.5-coder-0.5b-instruct-q4_k_m", max_tokens=2,
                          messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=smol.name, max_tokens=2, messages=[{"role": "user", "content": "word " * 5000}])
    assert e.value.body["type"] == "error"
