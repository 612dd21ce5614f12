"""Headless Chromium driven over the DevTools protocol on a pipe
(`--remote-debugging-pipe`: JSON messages ending in NUL on file descriptors 3
and 4), so the e2e tests need no driver or websocket package: only Debian's
`chromium` (installed by scripts/deps.sh)."""

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]


def binary():
    """The Chromium executable, or None when absent."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with a fresh profile and one page."""

    def __init__(self, extra=()):
        exe = binary()
        if exe is None:
            raise RuntimeError("chromium not found (scripts/deps.sh installs it)")
        self.profile = tempfile.mkdtemp(prefix="tempo9-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds():
            # Out of the way first, so the two dup2 calls cannot clobber each other.
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, "--user-data-dir=" + self.profile, *extra, "about:blank"],
            preexec_fn=fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, close_fds=False)  # closing runs after preexec_fn
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)

    def call(self, method, session=False, timeout=60, **params):
        """Sends one command (to the page when `session`) and returns its result."""
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply.get("result", {})

    def _read(self, deadline):
        while b"\0" not in self._buf:
            if time.time() > deadline:
                raise TimeoutError("no answer from chromium")
            ready, _, _ = select.select([self._from_child], [], [], 1.0)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium exited (code %s)" % self.proc.poll())
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def open(self, url, width=1400, height=1000):
        """Loads `url` in the page at the given window size."""
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", session=True, url=url)

    def eval(self, expression):
        """The value of a JavaScript expression in the page."""
        r = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait_for(self, expression, timeout=60):
        """Polls `expression` until it is truthy; its value (TimeoutError after `timeout` s)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                v = self.eval(expression)
            except RuntimeError:
                v = None  # the page is still loading
            if v:
                return v
            time.sleep(0.2)
        raise TimeoutError("%s stayed false for %s s" % (expression, timeout))

    def screenshot(self, path):
        """Writes the page as a PNG at `path`."""
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)
