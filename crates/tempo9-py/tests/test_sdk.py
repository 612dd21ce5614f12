"""The Python package on the real models (scripts/fetch-models.sh), on the CPU:
greedy chat equal to `tempo9 serve`'s answer for the same request, streaming,
asyncio, a tool-call round trip on Qwen2.5-Coder-0.5B, cancellation freeing KV
pages (engine stats), threads sharing one model and its prefix cache, the GIL
released while waiting, and typed errors.

The server binary comes from $TEMPO9_BIN or $CARGO_TARGET_DIR/release/tempo9."""

import asyncio
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

import tempo9

MODELS = os.environ.get("TEMPO9_MODELS", os.path.expanduser("~/.cache/tempo9/models"))
SMOL = os.path.join(MODELS, "smollm2-135m-instruct-q4_1.gguf")
QWEN = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
SMALL = dict(threads=2, context=4096, kv_budget_bytes=64 << 20, ssd=False)
GREEDY_MESSAGES = [{"role": "system", "content": "You are a concise assistant."},
                   {"role": "user", "content": "Name three colors of the rainbow."}]


def need(path):
    if not os.path.exists(path):
        pytest.fail("model %s missing (run scripts/fetch-models.sh)" % path)
    return path


@pytest.fixture(scope="module")
def smol():
    return tempo9.Model(need(SMOL), **SMALL)


def binary():
    if os.environ.get("TEMPO9_BIN"):
        return os.environ["TEMPO9_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target"))
    return os.path.join(target, "release", "tempo9")


def server_answer(model, body):
    """The same request through a `tempo9 serve` process (same file, same settings)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary(), "--gguf", model, "--port", str(port), "--threads", "2",
                             "--ctx", "4096", "--kv-budget", "64M", "--no-kv-ssd"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = "http://127.0.0.1:%d" % port
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "server did not start"
                time.sleep(0.2)
        req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_greedy_chat_equals_the_servers_answer(smol):
    ours = smol.chat(GREEDY_MESSAGES, temperature=0, max_tokens=48)
    theirs = server_answer(SMOL, {"messages": GREEDY_MESSAGES, "temperature": 0, "max_tokens": 48})
    assert ours.text and ours.text == theirs["choices"][0]["message"]["content"]
    assert ours.usage.completion_tokens == theirs["usage"]["completion_tokens"]
    assert ours.usage.prompt_tokens == theirs["usage"]["prompt_tokens"]


def test_streaming(smol):
    events = list(smol.chat([{"role": "user", "content": "Write one sentence about the sea."}],
                            stream=True, temperature=0, max_tokens=24))
    texts = [e.text for e in events if e.type == "text"]
    assert len(texts) > 3
    assert events[-1].type == "done" and events[-1].stop in ("end_turn", "length")
    assert events[-1].usage.completion_tokens > 3
    whole = smol.chat([{"role": "user", "content": "Write one sentence about the sea."}],
                      temperature=0, max_tokens=24)
    assert whole.text == "".join(texts)
    assert whole.usage.cached_tokens > 0  # the same prompt again: from the prefix cache
    ids = smol.tokenize("The sea is")
    toks = [e for e in smol.complete(ids, max_tokens=6, stop_at_eog=False) if e.type == "token"]
    assert len(toks) == 6


def test_asyncio(smol):
    async def main():
        s = await smol.achat([{"role": "user", "content": "Write one sentence about the sea."}],
                             stream=True, temperature=0, max_tokens=24)
        texts = [e.text async for e in s if e.type == "text"]
        # Two tasks at once on one model.
        a, b = await asyncio.gather(
            smol.achat(GREEDY_MESSAGES, temperature=0, max_tokens=48),
            smol.achat([{"role": "user", "content": "Say hello."}], temperature=0, max_tokens=8))
        return texts, a, b
    texts, a, b = asyncio.run(main())
    assert len(texts) > 3
    assert a.text == smol.chat(GREEDY_MESSAGES, temperature=0, max_tokens=48).text
    assert b.text and b.stop in ("end_turn", "length")


def wait_for(model, cond):
    deadline = time.time() + 30
    while True:
        s = model.stats()
        if cond(s):
            return s
        assert time.time() < deadline, s
        time.sleep(0.01)


def test_cancellation_frees_pages(smol):
    wait_for(smol, lambda s: s["running"] == 0)
    s = smol.chat([{"role": "user", "content": "Tell me a very long story about a dragon."}],
                  stream=True, temperature=0, max_tokens=2000)
    for _ in range(3):
        assert next(s).type == "text"
    busy = wait_for(smol, lambda s: s["running"] == 1)
    assert busy["kv_pages_used"] > 0
    s.close()
    after = wait_for(smol, lambda s: s["running"] == 0 and s["waiting"] == 0)
    assert after["kv_pages_used"] == 0


def test_threads_share_one_model_and_its_prefix_cache(smol):
    system = {"role": "system", "content": "You are the assistant of a hardware store. " +
              "Answer questions about tools, paint, garden supplies and opening hours politely. " * 12}
    ask = lambda q: smol.chat([system, {"role": "user", "content": q}], temperature=0, max_tokens=12)
    assert ask("Hello!").usage.prompt_tokens > 128
    out = {}
    threads = [threading.Thread(target=lambda q=q: out.__setitem__(q, ask(q)))
               for q in ("Do you sell hammers?", "When do you open on Sunday?")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 2
    for r in out.values():
        assert r.text and r.usage.cached_tokens >= 128


def test_gil_is_released_while_waiting():
    # One request runs at a time: a second one waits in the queue, producing nothing,
    # while its reader thread blocks in the native call. Python keeps running meanwhile.
    m = tempo9.Model(need(SMOL), **dict(SMALL, max_running=1))
    first = m.chat([{"role": "user", "content": "Tell me a very long story."}], stream=True,
                   temperature=0, max_tokens=2000)
    next(first)
    second = m.chat([{"role": "user", "content": "Hi"}], stream=True, temperature=0, max_tokens=4)
    got = []
    reader = threading.Thread(target=lambda: got.append(next(second)))
    reader.start()
    time.sleep(0.2)
    n, t0 = 0, time.time()
    while time.time() - t0 < 0.3:
        n += 1
    assert reader.is_alive() and not got  # still waiting in the native call
    assert n > 10000  # and this thread ran Python all along
    first.close()  # frees the engine for the second request
    reader.join(timeout=60)
    assert got and got[0].type in ("text", "done")
    second.close()


def test_tool_call_round_trip():
    m = tempo9.Model(need(QWEN), **SMALL)
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a given city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                       "required": ["city"]}}}
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris right now?"}]
    r = m.chat(msgs, [weather], temperature=0, max_tokens=40)
    assert r.stop == "tool_calls", r
    call = r.tool_calls[0]
    assert call.name == "get_weather" and "paris" in call.parsed_arguments()["city"].lower()
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 23 degrees Celsius."},
             {"role": "user", "content": "Now tell me the answer in one sentence."}]
    r2 = m.chat(msgs, [weather], temperature=0, max_tokens=32)
    assert r2.stop in ("end_turn", "length") and not r2.tool_calls
    assert "23" in r2.text
    assert r2.usage.cached_tokens >= 64


def test_typed_errors(smol, tmp_path):
    with pytest.raises(tempo9.BadFileError):
        tempo9.Model("/nonexistent/model.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file")
    with pytest.raises(tempo9.BadFileError):
        tempo9.Model(str(junk))
    with pytest.raises(tempo9.BadRequestError):
        tempo9.Model(SMOL, threads="two")
    with pytest.raises(tempo9.ContextOverflowError):
        smol.chat([{"role": "user", "content": "hello " * 5000}], max_tokens=4)
    with pytest.raises(tempo9.InvalidSchemaError):
        smol.chat(GREEDY_MESSAGES, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 12}}})
    with pytest.raises(tempo9.BadRequestError):
        smol.chat([{"role": "wizard", "content": "hi"}])
    assert issubclass(tempo9.ContextOverflowError, tempo9.Tempo9Error)
