"""No change in the agent (issue 35): with one model served, a request naming
any model (an agent's own `claude-…`, `gpt-…`) is answered by it through the
official openai, anthropic and ollama clients, every answer and listing names
the real model, and the mapping is logged once per name; `--strict-model-names`
restores the 404."""

import anthropic
import ollama
import openai
import pytest

from conftest import SMOL, Server

MSG = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def plain():
    """SmolLM2 with no alias, no key, default name rules."""
    s = Server(SMOL, [])
    yield s
    s.stop()


def oai(s):
    return openai.OpenAI(base_url=s.base + "/v1", api_key="any", max_retries=0, timeout=120)


def ant(s):
    return anthropic.Anthropic(base_url=s.base, api_key="any", max_retries=0, timeout=120)


def oll(s):
    return ollama.Client(host=s.base, timeout=120)


def test_agent_names_are_answered_with_the_real_name(plain):
    o = oai(plain)
    r = o.chat.completions.create(model="gpt-5-codex", messages=MSG, max_tokens=4)
    assert r.model == plain.name and r.choices[0].message.content is not None
    r = o.completions.create(model="gpt-4o", prompt="Hi", max_tokens=4)
    assert r.model == plain.name
    r = o.responses.create(model="gpt-5-codex", input="Say hi.", max_output_tokens=4)
    assert r.model == plain.name
    assert o.models.retrieve("gpt-5-codex").id == plain.name
    assert [m.id for m in o.models.list().data] == [plain.name]
    m = ant(plain).messages.create(model="claude-sonnet-4-5-20250929", max_tokens=4, messages=MSG)
    assert m.model == plain.name and m.content
    with ant(plain).messages.stream(model="claude-haiku-4-5", max_tokens=4, messages=MSG) as st:
        final = st.get_final_message()
    assert final.model == plain.name
    c = oll(plain)
    r = c.chat(model="llama3.2", messages=MSG, options={"num_predict": 4})
    assert r.model == plain.name
    r = c.generate(model="qwen3:8b", prompt="Hi", options={"num_predict": 4})
    assert r.model == plain.name
    assert [m.model for m in c.list().models] == [plain.name]
    log = plain.log_text()
    # Logged once per name, though gpt-5-codex was asked three times.
    assert log.count('requests for model "gpt-5-codex"') == 1, log
    assert "claude-sonnet-4-5-20250929" in log and "llama3.2" in log


def test_strict_names_restore_the_404():
    s = Server(SMOL, ["--strict-model-names"])
    try:
        with pytest.raises(openai.NotFoundError) as e:
            oai(s).chat.completions.create(model="gpt-5-codex", messages=MSG, max_tokens=4)
        assert "--strict-model-names" in str(e.value)
        with pytest.raises(anthropic.NotFoundError):
            ant(s).messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=MSG)
        with pytest.raises(ollama.ResponseError) as e:
            oll(s).chat(model="nope:1b", messages=MSG)
        assert e.value.status_code == 404
        r = oai(s).chat.completions.create(model=s.name, messages=MSG, max_tokens=4)
        assert r.model == s.name
    finally:
        s.stop()
