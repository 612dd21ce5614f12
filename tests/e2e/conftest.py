"""Fixtures: start the real `tempo9` server on the real small models.

The binary comes from $TEMPO9_BIN or $CARGO_TARGET_DIR/release/tempo9 (default
~/.cache/tempo9/target); models from $TEMPO9_MODELS (default
~/.cache/tempo9/models, fetched by scripts/fetch-models.sh).
"""

import os
import socket
import subprocess
import time
import urllib.request

import pytest

API_KEY = "e2e-test-key"
MODELS = os.environ.get("TEMPO9_MODELS", os.path.expanduser("~/.cache/tempo9/models"))
SMOL = "smollm2-135m-instruct-q4_1.gguf"
QWEN = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def binary():
    if os.environ.get("TEMPO9_BIN"):
        return os.environ["TEMPO9_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target"))
    return os.path.join(target, "release", "tempo9")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, extra, env=None):
        self.model_file = os.path.join(MODELS, model)
        if not os.path.exists(self.model_file):
            pytest.fail("model %s missing (run scripts/fetch-models.sh)" % self.model_file)
        if not os.access(binary(), os.X_OK):
            pytest.fail("tempo9 binary %s missing (cargo build --release -p tempo9-cli)" % binary())
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.name = os.path.splitext(model)[0]
        self.log_path = "/tmp/tempo9-e2e-%s-%d.log" % (self.name, self.port)
        self.log = open(self.log_path, "w")
        cmd = [binary(), "--gguf", self.model_file, "--host", "127.0.0.1", "--port", str(self.port),
               "--ctx", "4096", "--kv-budget", "256M"] + extra
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("tempo9 exited with %s:\n%s" % (self.proc.returncode, self.log_text()))
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        pytest.fail("tempo9 did not become healthy:\n" + self.log_text())

    def log_text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def smol():
    """SmolLM2-135M with an API key, a small body limit and a small output cap."""
    s = Server(SMOL, ["--api-key", API_KEY, "--max-body", "1M", "--alias", "smol"])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def qwen():
    """Qwen2.5-Coder-0.5B (Hermes-style tool calls), no key."""
    s = Server(QWEN, [])
    yield s
    s.stop()


VOCAB = os.environ.get("TEMPO9_VOCAB", os.path.expanduser("~/.cache/tempo9/vocab"))


@pytest.fixture(scope="session")
def qwen_think():
    """Qwen2.5-Coder-0.5B rendering chats with the Qwen3.5 template (llama.cpp's
    models/templates/Qwen3.5-4B.jinja, fetched by scripts/fetch-models.sh vocab):
    with thinking on, the prompt ends inside an open `<think>`."""
    path = os.path.join(VOCAB, "templates", "Qwen3.5-4B.jinja")
    if not os.path.exists(path):
        pytest.skip("!!! %s missing: run scripts/fetch-models.sh vocab !!!" % path)
    s = Server(QWEN, ["--chat-template-file", path])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def qwen3_template():
    """Qwen2.5-Coder-0.5B rendering chats with the Qwen3 template (Hermes tool
    calls, `<think>` reasoning the model opens itself)."""
    path = os.path.join(VOCAB, "templates", "Qwen-Qwen3-0.6B.jinja")
    if not os.path.exists(path):
        pytest.skip("!!! %s missing: run scripts/fetch-models.sh vocab !!!" % path)
    s = Server(QWEN, ["--chat-template-file", path])
    yield s
    s.stop()
