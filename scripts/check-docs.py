#!/usr/bin/env python3
"""Checks the documentation against the code (issue 35).

1. Links: every relative link in docs/**/*.md, README.md and bench/README.md
   names a file or directory of the repository, and a `#anchor` on a Markdown
   file names one of its headings.
2. Commands: every fenced `sh` and `python` block of docs/manual/*.md and
   README.md is either run here, against a real `tempo9` server on SmolLM2-135M
   (curl requests, the SDK examples, `tempo9 run` / `bench` / `--help` …), or,
   line by line, matched by COVERED below, which names the test or script that
   runs that command; the checker makes sure that file exists and holds the
   named text, so a claim of coverage cannot outlive the test. Anything else is
   run, so an example nobody ran fails here.

    python3 scripts/check-docs.py [--links-only] [--only FILE:LINE ...]

Environment: TEMPO9_BIN (default $CARGO_TARGET_DIR/release/tempo9, else
~/.cache/tempo9/target/release/tempo9), TEMPO9_MODELS (default
~/.cache/tempo9/models). Exit status 1 on any failure, each one listed.
"""

import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODELS = os.environ.get("TEMPO9_MODELS", os.path.expanduser("~/.cache/tempo9/models"))
MODEL = "smollm2-135m-instruct-q4_1"
TIMEOUT = 900  # seconds per block (generous: CI machines are small and may be busy)

# Commands run elsewhere: (regex on one command line, file that runs it, text
# that file must hold).
COVERED = [
    (r"^scripts/up\.sh\b", "scripts/up.sh", "serve"),
    (r"^scripts/test\.sh\b", "scripts/test.sh", "cargo test"),
    # Serving blocks: this checker serves the model the same way to run the rest,
    # and the e2e fixtures start every server of the e2e suite so.
    (r"^(\$T|tempo9) (serve )?--gguf \S+( --port \S+)?( --ctx \S+)?( --served-name \S+)?\s*$",
     "tests/e2e/conftest.py", '"--gguf", self.model_file'),
    (r"^(\$T|tempo9) --model qwen2\.5-coder:0\.5b\s*$", "tests/e2e/test_ollama_store.py",
     '"--model", "qwen2.5-coder:0.5b"'),
    # Ollama itself is not installed by the tests: this test lays out the store
    # as `ollama pull` leaves it.
    (r"^ollama pull ", "tests/e2e/test_ollama_store.py", "as `ollama pull` leaves it"),
    # Agents' own commands and settings: bench/agents/run.sh runs each client.
    (r"^export (ANTHROPIC_|CLAUDE_CODE_|API_TIMEOUT_MS)", "bench/agents/run.sh", "ANTHROPIC_BASE_URL"),
    (r"^claude\b", "bench/agents/run.sh", "claude -p"),
    (r"^TEMPO9_API_KEY=\S+ codex\b", "bench/agents/run.sh", "codex exec"),
    (r"^openclaw agent exec ", "bench/agents/run.sh", "openclaw agent exec"),
    (r"^opencode\b", "bench/agents/run.sh", "opencode run"),
]

# Substitutions that point a block at the checker's server and binary.
def localize(text, port, binary):
    text = re.sub(r"(localhost|127\.0\.0\.1):11435", "127.0.0.1:%d" % port, text)
    text = text.replace("~/.cache/tempo9/target/release/tempo9", binary)
    text = text.replace("~/.cache/tempo9/models", MODELS)
    return text


def blocks(path):
    """(line number, language, source) of each fenced block."""
    out, lang, start, buf = [], None, 0, []
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        m = re.match(r"^```(\w*)\s*$", line)
        if m and lang is None:
            lang, start, buf = m.group(1) or "text", i, []
        elif line.startswith("```") and lang is not None:
            out.append((start, lang, "".join(buf)))
            lang = None
        elif lang is not None:
            buf.append(line)
    return out


def commands(src):
    """The command lines of a shell block (continuations joined, comments dropped)."""
    out, cur = [], ""
    for line in src.splitlines():
        cur += line
        if cur.endswith("\\"):
            cur = cur[:-1]
            continue
        cmd = strip_comment(cur).strip()
        cur = ""
        if cmd and not cmd.startswith("#"):
            out.append(cmd)
    return out


def strip_comment(line):
    """`line` without a trailing shell comment (a `#` after a blank, outside quotes)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def covered(cmd):
    for pattern, path, marker in COVERED:
        if re.search(pattern, cmd):
            return path, marker
    return None


def check_links(failures):
    files = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    files += [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "bench", "README.md")]
    n = 0
    for f in sorted(files):
        text = open(f, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # code is not links
        for m in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # absolute URL
            n += 1
            where = "%s: link %s" % (os.path.relpath(f, ROOT), target)
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not full.startswith(ROOT):
                failures.append(where + " leaves the repository")
            elif not os.path.exists(full):
                failures.append(where + " names a missing file")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                failures.append(where + " names a missing heading")
    return n


def anchors(path):
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
    for m in re.finditer(r"^#+\s+(.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        base, k = slug, 1
        while slug in out:
            slug, k = "%s-%d" % (base, k), k + 1
        out.add(slug)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary():
    if os.environ.get("TEMPO9_BIN"):
        return os.environ["TEMPO9_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tempo9/target"))
    return os.path.join(target, "release", "tempo9")


class Server:
    """`tempo9 --gguf SmolLM2 --port P`, as the manual's first command."""

    def __init__(self, port):
        model = os.path.join(MODELS, MODEL + ".gguf")
        if not os.path.exists(model):
            sys.exit("model %s missing: run scripts/fetch-models.sh" % model)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="tempo9-check-docs-", suffix=".log")
        self.proc = subprocess.Popen([binary(), "--gguf", model, "--port", str(port), "--ctx", "4096",
                                      "--kv-budget", "256M"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                sys.exit("tempo9 exited:\n" + self.log.read()[-3000:])
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        sys.exit("tempo9 did not become healthy")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# Prepended to each shell block: `tempo9` is the binary under test; curl fails
# on HTTP errors, and an endless stream (`curl -N … stream=true`) is cut after
# 3 s, which is a pass once something arrived.
PRELUDE = r"""
set -euo pipefail
tempo9() { "$TEMPO9_CHECK_BIN" "$@"; }
curl() {
  case " $* " in
    *stream=true*)
      local out rc=0
      out=$(command curl -sS --fail-with-body --max-time 3 "$@") || rc=$?
      printf '%s\n' "$out" | head -c 2000
      [ "$rc" = 28 ] && [ -n "$out" ] && return 0
      return "$rc" ;;
    *) command curl -sS --fail-with-body --max-time 120 "$@"; echo ;;
  esac
}
"""


def run_block(where, lang, src, port, failures, ran):
    src = localize(src, port, binary())
    if lang == "python":
        cmd = [sys.executable, "-c", src]
    else:
        lines = []
        for c in commands(src):
            cov = covered(c)
            if cov:
                path, marker = cov
                full = os.path.join(ROOT, path)
                if not os.path.exists(full) or marker not in open(full, encoding="utf-8").read():
                    failures.append("%s: `%s` is said to be run by %s (holding %r), which does not"
                                    % (where, c, path, marker))
                else:
                    ran.append("%s: `%s` -> %s" % (where, c[:70], path))
            else:
                lines.append(c)
                ran.append("%s: `%s` -> run here" % (where, c[:70]))
        if not lines:
            return
        cmd = ["bash", "-c", PRELUDE + "\n".join(lines)]
    env = dict(os.environ, TEMPO9_CHECK_BIN=binary())
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=TIMEOUT, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        failures.append("%s: timed out after %d s" % (where, TIMEOUT))
        return
    ran.append("%s: block ran in %.1f s" % (where, time.time() - t0))
    if p.returncode != 0 or not p.stdout.strip():
        failures.append("%s: exit %d, stdout %r\nstderr: %s"
                        % (where, p.returncode, p.stdout[-800:], p.stderr[-1500:]))


def main():
    failures, ran = [], []
    # --only FILE:LINE (repeatable): just those blocks, e.g. to retry a failure.
    only = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--only"]
    n_links = check_links(failures)
    print("links: %d relative links checked" % n_links)
    if "--links-only" not in sys.argv:
        if not os.access(binary(), os.X_OK):
            sys.exit("tempo9 binary %s missing (cargo build --release -p tempo9-cli)" % binary())
        port = free_port()
        server = Server(port)
        try:
            docs = sorted(glob.glob(os.path.join(ROOT, "docs", "manual", "*.md")))
            for f in docs + [os.path.join(ROOT, "README.md")]:
                for line, lang, src in blocks(f):
                    where = "%s:%d" % (os.path.relpath(f, ROOT), line)
                    if lang in ("sh", "bash", "python") and (not only or where in only):
                        run_block(where, lang, src, port, failures, ran)
        finally:
            server.stop()
        print("commands:\n  " + "\n  ".join(ran))
    if failures:
        print("\nFAILED (%d):\n- %s" % (len(failures), "\n- ".join(failures)), file=sys.stderr)
        sys.exit(1)
    print("docs check passed")


if __name__ == "__main__":
    main()
