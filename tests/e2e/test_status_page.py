"""The status page at `/` in headless Chromium (issue 35): the real server with
an API key and requests in flight from three clients, the page loaded with the
key, its DOM checked against `/v1/status` (the running requests, their API and
client, the KV page counts), no prompt text shown, the key and the Host rules
enforced. With TEMPO9_WRITE_STATUS_SCREENSHOT=1 it also writes the manual's
screenshot (docs/status-page.png).

Chromium is Debian's `chromium`, installed by scripts/deps.sh; the test skips
(loudly) only where no Chromium binary exists at all."""

import json
import os
import threading
import time
import urllib.request

import ollama
import openai
import pytest

import chromium
from conftest import SMOL, Server

KEY = "status-page-key"
SECRET = "walrus-secret-9182"
# A grammar keeps each request generating (no early end of text) until the
# test closes its stream: an array of at least 600 integers.
LONG = {"type": "array", "minItems": 600, "items": {"type": "integer"}}
SHOT = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "status-page.png")

pytestmark = pytest.mark.skipif(chromium.binary() is None,
                                reason="!!! chromium missing: run scripts/deps.sh !!!")


def status(s):
    req = urllib.request.Request(s.base + "/v1/status", headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


class Load:
    """Streaming requests from the openai (chat and responses) and ollama
    clients on threads, each read until `stop` is set, then closed."""

    def __init__(self, s, n_chat=2):
        self.stop = threading.Event()
        self.errors = []
        msgs = [{"role": "user", "content": "List numbers. The code word is %s." % SECRET}]
        oai = openai.OpenAI(base_url=s.base + "/v1", api_key=KEY, max_retries=0, timeout=300)
        fmt = {"type": "json_schema", "json_schema": {"name": "numbers", "schema": LONG}}
        jobs = [lambda: oai.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=4000,
                                                    response_format=fmt, stream=True)] * n_chat
        jobs.append(lambda: oai.responses.create(
            model="gpt-5-codex", input=msgs[0]["content"], max_output_tokens=4000, stream=True,
            text={"format": {"type": "json_schema", "name": "numbers", "schema": LONG}}))
        oll = ollama.Client(host=s.base, headers={"Authorization": "Bearer " + KEY}, timeout=300)
        jobs.append(lambda: oll.chat(model="llama3.2", messages=msgs, format=LONG, stream=True,
                                     options={"num_predict": 4000}))
        self.threads = [threading.Thread(target=self._run, args=(j,), daemon=True) for j in jobs]
        for t in self.threads:
            t.start()

    def _run(self, job):
        try:
            stream = job()
            for _ in stream:
                if self.stop.is_set():
                    break
            close = getattr(stream, "close", None)
            if close:
                close()
        except Exception as e:  # reported by finish()
            self.errors.append(e)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, self.errors


@pytest.fixture(scope="module")
def keyed():
    s = Server(SMOL, ["--api-key", KEY, "--max-running", "3"])
    yield s
    s.stop()


def test_page_shows_the_running_requests_and_kv_pages(keyed):
    load = Load(keyed)
    b = chromium.Browser()
    try:
        # Four requests, at most three running: three rows running, one waiting.
        deadline = time.time() + 120
        while time.time() < deadline:
            st = status(keyed)
            if len(st["requests"]["running"]) == 3 and st["requests"]["waiting"]:
                break
            time.sleep(0.2)
        else:
            pytest.fail("four requests never in flight: %s" % st["requests"])
        b.open(keyed.base + "/?key=" + KEY)
        rows = b.wait_for("""(() => {
            const rows = [...document.querySelectorAll('#reqs tr')].map(tr =>
                [...tr.children].map(td => td.textContent));
            return rows.length >= 4 ? rows : null; })()""")
        apis = sorted(r[2] for r in rows)
        assert apis == ["ollama", "openai", "openai", "responses"], rows
        states = [r[1] for r in rows]
        assert states.count("waiting") == 1 and all(s in ("prefill", "decode", "waiting") for s in states), rows
        clients = " ".join(r[3] for r in rows)
        assert "OpenAI/Python" in clients and "ollama-python" in clients, rows
        assert all(int(r[4].replace(",", "")) > 10 for r in rows), rows  # prompt tokens
        # Counters and the KV tier line against the server's own snapshot.
        assert b.wait_for("document.getElementById('c-running').textContent") == "3"
        st = status(keyed)
        ram = st["kv"]["ram"]
        tiers = b.eval("document.getElementById('tiers').textContent")
        assert "free of %s" % format(ram["total"], ",") in tiers or "free of %d" % ram["total"] in tiers, tiers
        used = int(tiers.split(" used")[0].split("RAM pages")[-1].replace(",", "").strip())
        assert used > 0, tiers
        assert b.eval("document.getElementById('model').textContent").startswith(keyed.name)
        # No prompt text without --status-prompts.
        html = b.eval("document.documentElement.outerHTML")
        assert SECRET not in html and "walrus" not in html
        assert b.eval("document.querySelectorAll('#reqs tr.prompt').length") == 0
        if os.environ.get("TEMPO9_WRITE_STATUS_SCREENSHOT") == "1":
            time.sleep(8)  # a few points in the charts
            b.screenshot(SHOT)
    finally:
        load.finish()
        b.close()
    # Once the clients hang up, the page empties.
    b = chromium.Browser()
    try:
        b.open(keyed.base + "/?key=" + KEY)
        b.wait_for("document.getElementById('c-running').textContent === '0'"
                   " && document.querySelectorAll('#reqs tr').length === 0", timeout=60)
        assert b.eval("getComputedStyle(document.getElementById('noreqs')).display") != "none"
    finally:
        b.close()


def test_page_asks_for_the_key_and_shows_nothing_without_it(keyed):
    b = chromium.Browser()
    try:
        b.open(keyed.base + "/")
        msg = b.wait_for("document.getElementById('error').textContent")
        assert "requires an API key" in msg
        assert b.eval("document.getElementById('keybox').classList.contains('show')")
        assert b.eval("document.getElementById('c-running').textContent") == "–"
        b.open(keyed.base + "/?key=wrong")
        assert "refused" in b.wait_for("document.getElementById('error').textContent")
    finally:
        b.close()


def test_page_refuses_foreign_host_names(keyed):
    # DNS rebinding: a name that resolves to the server but is not allowed.
    b = chromium.Browser(["--host-resolver-rules=MAP evil.example 127.0.0.1"])
    try:
        b.open("http://evil.example:%d/?key=%s" % (keyed.port, KEY))
        text = b.wait_for("document.body && document.body.innerText")
        assert "DNS rebinding" in text, text
        assert b.eval("document.getElementById('reqs')") is None
    finally:
        b.close()


def test_page_shows_prompts_only_when_allowed():
    s = Server(SMOL, ["--status-prompts"])
    load = None
    b = chromium.Browser()
    try:
        load = LoadNoKey(s)
        b.open(s.base + "/")
        text = b.wait_for("(() => { const p = document.querySelector('#reqs tr.prompt');"
                          " return p && p.textContent; })()")
        assert SECRET in text
    finally:
        if load:
            load.finish()
        b.close()
        s.stop()


class LoadNoKey(Load):
    """One chat stream to a server without a key."""

    def __init__(self, s):
        self.stop = threading.Event()
        self.errors = []
        msgs = [{"role": "user", "content": "List numbers. The code word is %s." % SECRET}]
        oai = openai.OpenAI(base_url=s.base + "/v1", api_key="any", max_retries=0, timeout=300)
        fmt = {"type": "json_schema", "json_schema": {"name": "numbers", "schema": LONG}}
        job = lambda: oai.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=4000,  # noqa: E731
                                                  response_format=fmt, stream=True)
        self.threads = [threading.Thread(target=self._run, args=(job,), daemon=True)]
        self.threads[0].start()
