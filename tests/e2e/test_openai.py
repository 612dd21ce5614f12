"""OpenAI API through the official `openai` client."""

import json

import httpx
import openai
import pytest

from conftest import API_KEY

MSG = [{"role": "user", "content": "Say hello in one short sentence."}]


def client(srv, key=API_KEY):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=key, max_retries=0, timeout=120)


def test_models(smol):
    ids = [m.id for m in client(smol).models.list().data]
    assert smol.name in ids and "smol" in ids


def test_chat_stream_matches_non_stream(smol):
    c = client(smol)
    r = c.chat.completions.create(model=smol.name, messages=MSG, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(c.chat.completions.create(model=smol.name, messages=MSG, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text  # greedy: the same tokens either way
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [r.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_max_tokens_stop_and_seed(smol):
    c = client(smol)
    r = c.chat.completions.create(model=smol.name, messages=MSG, max_completion_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    full = c.chat.completions.create(model=smol.name, messages=MSG, max_tokens=12, temperature=0)
    text = full.choices[0].message.content
    stop = text.split()[1] if len(text.split()) > 1 else text[1:3]
    r = c.chat.completions.create(model=smol.name, messages=MSG, max_tokens=12, temperature=0, stop=[stop])
    assert stop not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    a = c.chat.completions.create(model=smol.name, messages=MSG, max_tokens=10, temperature=1.0, seed=42)
    b = c.chat.completions.create(model=smol.name, messages=MSG, max_tokens=10, temperature=1.0, seed=42)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_logprobs(smol):
    r = client(smol).chat.completions.create(model=smol.name, messages=MSG, max_tokens=4, temperature=0,
                                             logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4


def test_completions(smol):
    c = client(smol)
    r = c.completions.create(model=smol.name, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens <= 5
    s = "".join(ch.choices[0].text for ch in c.completions.create(
        model=smol.name, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True)
        if ch.choices)
    assert s == r.choices[0].text


def test_prefix_cache_reports_cached_tokens(smol):
    system = "You are a careful assistant. " + " ".join("Rule %d: answer briefly and politely." % i
                                                          for i in range(40))
    c = client(smol)
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    first = c.chat.completions.create(model=smol.name, messages=msgs, max_tokens=2, temperature=0)
    msgs[1]["content"] = "Hello there"
    second = c.chat.completions.create(model=smol.name, messages=msgs, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens > 256
    assert second.usage.prompt_tokens_details.cached_tokens >= 192


def test_errors(smol):
    with pytest.raises(openai.AuthenticationError) as e:
        client(smol, key="wrong").chat.completions.create(model=smol.name, messages=MSG, max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
    # Any name is answered by the one model served, but another local model's name
    # (a GGUF file beside it) is a 404.
    with pytest.raises(openai.NotFoundError) as e:
        client(smol).chat.completions.create(model="qwen2.5-coder-0.5b-instruct-q4_k_m", messages=MSG,
                                             max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client(smol).chat.completions.create(model=smol.name, messages=[{"role": "robot", "content": "x"}])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        client(smol).chat.completions.create(model=smol.name, messages=MSG, temperature=5)
    with pytest.raises(openai.BadRequestError) as e:
        long = "word " * 5000
        client(smol).chat.completions.create(model=smol.name, messages=[{"role": "user", "content": long}])
    assert e.value.body["code"] == "context_length_exceeded"
    headers = {"Authorization": "Bearer " + API_KEY}
    r = httpx.post(smol.base + "/v1/chat/completions", headers=headers, content=b"{not json")
    assert r.status_code == 400 and "error" in r.json()
    big = json.dumps({"model": smol.name, "messages": [{"role": "user", "content": "x" * (2 << 20)}]})
    r = httpx.post(smol.base + "/v1/chat/completions", headers=headers, content=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(smol.base + "/v1/nothing", headers=headers)
    assert r.status_code == 404


def test_health_and_metrics(smol):
    assert httpx.get(smol.base + "/health").json()["status"] == "ok"
    assert httpx.get(smol.base + "/metrics").status_code == 401
    client(smol).chat.completions.create(model=smol.name, messages=MSG, max_tokens=3, temperature=0)
    m = httpx.get(smol.base + "/metrics", headers={"Authorization": "Bearer " + API_KEY}).text
    for name in ("tempo9_requests_waiting", "tempo9_kv_pages_used", "tempo9_prefix_cache_hit_rate",
                 "tempo9_time_to_first_token_seconds_bucket", "tempo9_inter_token_latency_seconds_count",
                 "tempo9_generation_tokens_per_second"):
        assert name in m
    count = [l for l in m.splitlines() if l.startswith("tempo9_time_to_first_token_seconds_count")][0]
    assert int(count.split()[1]) >= 1


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def test_response_format_json_schema(smol):
    r = client(smol).chat.completions.create(
        model=smol.name, messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)
    assert r.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError):
        client(smol).chat.completions.create(model=smol.name, messages=MSG, response_format={"type": "yaml"})
