"""Issue 33 through the real `tempo9` binary: the access flags are wired
(`--allowed-host`, `--cors-origin`), a second Ctrl-C exits at once while the
first waits for running requests, and the default log level holds no prompt or
completion text."""

import http.client
import json
import os
import signal
import time

from conftest import SMOL, Server


def request(server, method, path, headers=None, body=None):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode())
    c.close()
    return out


def test_access_flags_reach_the_server():
    s = Server(SMOL, ["--allowed-host", "box.lan", "--cors-origin", "http://app.example"])
    try:
        assert request(s, "GET", "/v1/models", {"Host": "box.lan:%d" % s.port})[0] == 200
        status, _, body = request(s, "GET", "/v1/models", {"Host": "evil.example"})
        assert status == 403 and "DNS rebinding" in body
        pre = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
        status, head, _ = request(s, "OPTIONS", "/v1/chat/completions", pre)
        assert status == 204 and head["access-control-allow-origin"] == "http://app.example"
        pre["Origin"] = "http://evil.example"
        assert request(s, "OPTIONS", "/v1/chat/completions", pre)[0] == 403
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        assert request(s, "POST", "/v1/chat/completions", {"Content-Type": "text/plain"}, body)[0] == 415
    finally:
        s.stop()


def test_default_logs_hold_no_prompt_or_completion_text():
    env = {k: v for k, v in os.environ.items() if k != "TEMPO9_LOG"}
    # Strict names: an unknown model is an error echoing the name (by default it
    # would be answered, and the name logged as the mapping, by design).
    s = Server(SMOL, ["--strict-model-names"], env=env)
    secret = "zebra-secret-4711"
    try:
        msgs = [{"role": "user", "content": "Repeat after me: %s %s" % (secret, secret)}]
        for stream in (False, True):
            body = json.dumps({"messages": msgs, "max_tokens": 24, "temperature": 0, "stream": stream})
            status, _, answer = request(s, "POST", "/v1/chat/completions", {"Content-Type": "application/json"}, body)
            assert status == 200, answer
        # Errors that echo parts of the request, and a grammar that dead-ends.
        bad = {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}],
               "tool_choice": {"type": "function", "function": {"name": secret}}}
        assert request(s, "POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(bad))[0] == 400
        gen = json.dumps({"model": secret, "prompt": secret, "stream": False})
        assert request(s, "POST", "/api/generate", {"Content-Type": "application/json"}, gen)[0] == 404
    finally:
        s.stop()
    with open(s.log_path) as f:
        log = f.read()
    assert "serving" in log, log  # the log is this server's
    assert secret not in log, log
    assert "zebra" not in log, log


def test_second_ctrl_c_exits_at_once():
    s = Server(SMOL, [])
    try:
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        body = json.dumps({"messages": [{"role": "user", "content": "Tell a very long story."}],
                           "max_tokens": 4000, "temperature": 0, "stream": True})
        c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        r.fp.readline()  # the stream is running
        s.proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert s.proc.poll() is None, "the first Ctrl-C must wait for the running request"
        t0 = time.time()
        s.proc.send_signal(signal.SIGINT)
        s.proc.wait(timeout=10)
        assert time.time() - t0 < 5
        assert s.proc.returncode == 130
    finally:
        s.stop()
