"""Ollama API through the official `ollama` client."""

import httpx
import ollama
import pytest

from conftest import API_KEY


def client(srv):
    return ollama.Client(host=srv.base, headers={"Authorization": "Bearer " + API_KEY}, timeout=120)


def test_chat_generate_stream(smol):
    c = client(smol)
    msgs = [{"role": "user", "content": "Say hello."}]
    opts = {"temperature": 0, "num_predict": 8}
    r = c.chat(model=smol.name, messages=msgs, options=opts)
    assert r.message.role == "assistant" and r.message.content and r.done
    assert r.done_reason in ("stop", "length") and r.eval_count > 0 and r.prompt_eval_count > 0
    parts = list(c.chat(model=smol.name, messages=msgs, options=opts, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    g = c.generate(model=smol.name, prompt="Why is the sky blue?", options=opts)
    assert g.response and g.done
    raw = c.generate(model=smol.name, prompt="1, 2, 3,", raw=True, options={"temperature": 0, "num_predict": 4})
    assert raw.response


def test_listing(smol):
    c = client(smol)
    names = [m.model for m in c.list().models]
    assert smol.name in names
    show = c.show(smol.name)
    assert show.details.format == "gguf" and show.details.quantization_level == "Q4_1"
    assert "general.architecture" in show.modelinfo
    assert [m.model for m in c.ps().models] == [smol.name]
    v = httpx.get(smol.base + "/api/version", headers={"Authorization": "Bearer " + API_KEY}).json()
    assert v["version"]


def test_errors(smol):
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=smol.base).chat(model=smol.name, messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 401


def test_format_schema(smol):
    import json
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    r = client(smol).chat(model=smol.name, messages=[{"role": "user", "content": "Name a city as JSON."}],
                          format=schema, options={"temperature": 0, "num_predict": 30})
    assert list(json.loads(r.message.content)) == ["city"]
