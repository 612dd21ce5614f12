"""Graceful shutdown of the real `tempo9` binary: SIGTERM stops admission, lets the
running stream finish, exits 0, and writes the RAM prefix cache to the persistent SSD
tier, which the next start serves from (bench/crash/kill9.py covers kill -9)."""

import http.client
import json
import shutil
import signal
import tempfile
import time
import urllib.request

from conftest import SMOL, Server

DOC = "You are terse. " + " ".join("river stone lamp orbit cedar mango violet signal".split() * 40)


def chat(port, stream=False, max_tokens=8, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = json.dumps({"messages": [{"role": "system", "content": DOC}, {"role": "user", "content": "Summarize."}],
                       "max_tokens": max_tokens, "temperature": 0, "stream": stream})
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def ssd(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/v1/status" % port, timeout=10) as r:
        return json.loads(r.read())["kv"]["ssd"]


def test_sigterm_finishes_the_stream_and_flushes_the_tier():
    kv = tempfile.mkdtemp(prefix="tempo9-e2e-shutdown-")
    try:
        s = Server(SMOL, ["--kv-persist", "--kv-ssd-dir", kv, "--deterministic"])
        try:
            c, r = chat(s.port)
            first = json.loads(r.read())["choices"][0]["message"]["content"]
            c.close()
            assert ssd(s.port)["pages"] == 0  # the prefix is cached in RAM only
            c, r = chat(s.port, stream=True, max_tokens=48)
            assert r.status == 200
            r.fp.readline()  # the stream is running
            s.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            # No new request is admitted...
            try:
                _, r2 = chat(s.port, timeout=3)
                assert r2.status != 200, "a request was admitted after SIGTERM"
            except OSError:
                pass
            # ...while the running stream goes on to its end.
            # (Raw chunked bytes: the first line was read past the response's decoder.)
            rest = b"".join(iter(r.fp.readline, b"")).decode()
            assert "data: [DONE]" in rest and rest.endswith("0\r\n\r\n"), rest[-300:]
            assert s.proc.wait(timeout=60) == 0
        finally:
            s.stop()
        # The next start has the prefix on the SSD tier (written at shutdown) and
        # answers from it as before.
        s = Server(SMOL, ["--kv-persist", "--kv-ssd-dir", kv, "--deterministic"])
        try:
            assert ssd(s.port)["pages"] > 0
            c, r = chat(s.port)
            assert json.loads(r.read())["choices"][0]["message"]["content"] == first
            c.close()
            assert ssd(s.port)["hit_tokens"] > 0
        finally:
            s.stop()
    finally:
        shutil.rmtree(kv, ignore_errors=True)
