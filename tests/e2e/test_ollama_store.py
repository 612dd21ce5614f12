"""`tempo9 --model NAME` (docs/manual/ollama.md) through the real binary: a
store laid out as `ollama pull` leaves it (manifests/…/NAME/TAG naming a
sha256 blob) in $OLLAMA_MODELS, the model served under its Ollama name, and
the name of another model of that store a 404 while agents' own names are
answered (issue 35)."""

import hashlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import ollama
import pytest

from conftest import MODELS, QWEN, SMOL, binary, free_port


def add(root, name, tag, gguf):
    """Adds `name:tag` to the store at `root`, its model blob a link to `gguf`."""
    hexd = hashlib.sha256(("%s:%s" % (name, tag)).encode()).hexdigest()
    blobs = os.path.join(root, "blobs")
    os.makedirs(blobs, exist_ok=True)
    os.symlink(gguf, os.path.join(blobs, "sha256-" + hexd))
    mdir = os.path.join(root, "manifests", "registry.ollama.ai", "library", name)
    os.makedirs(mdir, exist_ok=True)
    manifest = {"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + hexd, "size": 1}]}
    with open(os.path.join(mdir, tag), "w") as f:
        json.dump(manifest, f)


def test_serve_a_model_from_the_ollama_store(tmp_path):
    root = str(tmp_path / "ollama")
    add(root, "qwen2.5-coder", "0.5b", os.path.join(MODELS, QWEN))
    add(root, "smollm2", "135m", os.path.join(MODELS, SMOL))
    port = free_port()
    base = "http://127.0.0.1:%d" % port
    log = open(str(tmp_path / "server.log"), "w")
    env = dict(os.environ, OLLAMA_MODELS=root)
    proc = subprocess.Popen([binary(), "--model", "qwen2.5-coder:0.5b", "--port", str(port),
                             "--ctx", "4096", "--kv-budget", "256M"], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None and time.time() < deadline, open(log.name).read()
            try:
                urllib.request.urlopen(base + "/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        c = ollama.Client(host=base, timeout=120)
        assert [m.model for m in c.list().models] == ["qwen2.5-coder:0.5b"]
        r = c.generate(model="qwen2.5-coder:0.5b", prompt="Hi", options={"num_predict": 4})
        assert r.model == "qwen2.5-coder:0.5b" and r.done
        r = c.chat(model="gpt-5-codex", messages=[{"role": "user", "content": "Hi"}],
                   options={"num_predict": 4})
        assert r.model == "qwen2.5-coder:0.5b"
        with pytest.raises(ollama.ResponseError) as e:
            c.chat(model="smollm2:135m", messages=[{"role": "user", "content": "Hi"}])
        assert e.value.status_code == 404 and "another model on this machine" in str(e.value)
        req = urllib.request.Request(base + "/v1/chat/completions", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "smollm2:135m", "max_tokens": 1,
                                                      "messages": [{"role": "user", "content": "x"}]}).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        assert e.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
