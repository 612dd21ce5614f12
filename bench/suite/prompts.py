"""Deterministic prompt material for the benchmark suite (stdlib only).

Everything here is a pure function of its arguments: the same call gives the
same text on every machine and every run, so both engines see identical
requests and results stay comparable across commits.

* `system_prompt(target_tokens)`: a coding-agent system prompt. The first part
  (identity, rules, output format and ten JSON-schema tool definitions in a
  Hermes-style `<tools>` block) is ~1.5K tokens on its own; larger targets
  append a "project context" section (file tree, conventions, source
  excerpts of a made-up repository). Larger targets are text-extensions of
  smaller ones, so a bigger prompt shares the smaller one's prefix.
* `agent_task(i)`, `agent_step(i, k)`: four agents' tasks and the k-th
  (assistant tool call, tool result) pair of agent i's history.

The tool definitions live inside the system text (as a client that renders its
own tool block does) instead of the request's `tools` field: SmolLM2's chat
template drops `tools`, and a text block makes the token count independent of
each engine's template handling.

Token counts are estimated with a chars-per-token ratio measured on the two
models' tokenizers (see CHARS_PER_TOKEN); the harness records the real
`usage.prompt_tokens` of every request.
"""

import json
import random

# Characters per token of system_prompt() output, measured with llama-server
# /tokenize (bench/suite/calibrate.py). Used only to size prompts.
CHARS_PER_TOKEN = 3.9
CHARS_PER_TOKEN_BY_MODEL = {"smollm2": 3.62, "qwen": 4.25, "gemma3": 3.58,
                            # the synthetic Qwen3.5-MoE files carry llama.cpp's qwen35 vocabulary
                            "qwen35moe-4l": 4.24, "qwen35moe-35b": 4.24, "qwen35moe-tiny": 4.24}


def cpt(model_key):
    return CHARS_PER_TOKEN_BY_MODEL.get(model_key, CHARS_PER_TOKEN)

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a text file and return it with 1-based line numbers. Use offset/limit for large files.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace root."},
                "offset": {"type": "integer", "minimum": 1},
                "limit": {"type": "integer", "minimum": 1, "maximum": 2000},
            },
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file with the given content. Prefer edit_file for small changes.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
            },
            "required": ["path", "content"],
        },
    },
    {
        "name": "edit_file",
        "description": "Replace an exact, unique occurrence of old_string with new_string. Fails if old_string is "
                       "missing or not unique unless replace_all is true.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean", "default": False},
            },
            "required": ["path", "old_string", "new_string"],
        },
    },
    {
        "name": "list_dir",
        "description": "List a directory's entries with sizes; .gitignore'd paths are omitted unless include_ignored.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "default": "."},
                "depth": {"type": "integer", "minimum": 1, "maximum": 5, "default": 1},
                "include_ignored": {"type": "boolean", "default": False},
            },
            "required": [],
        },
    },
    {
        "name": "glob",
        "description": "Find files matching a glob pattern such as 'src/**/*.py', newest first, at most 200.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string"},
            },
            "required": ["pattern"],
        },
    },
    {
        "name": "grep",
        "description": "Search file contents with a regular expression (ripgrep syntax); returns file:line:text.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string", "default": "."},
                "include": {"type": "string", "description": "Glob of files to search, e.g. '*.rs'."},
                "context_lines": {"type": "integer", "minimum": 0, "maximum": 10},
            },
            "required": ["pattern"],
        },
    },
    {
        "name": "run_shell",
        "description": "Run a shell command in the workspace with a timeout; returns exit code, stdout and stderr. "
                       "No interactive programs or servers.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout_s": {"type": "integer", "minimum": 1, "maximum": 600},
            },
            "required": ["command"],
        },
    },
    {
        "name": "run_tests",
        "description": "Run the test suite or a subset; returns failures with tracebacks.",
        "parameters": {
            "type": "object",
            "properties": {
                "target": {"type": "string", "description": "Test file, directory or node id."},
                "fail_fast": {"type": "boolean"},
            },
            "required": [],
        },
    },
    {
        "name": "git",
        "description": "Run a git operation (status, diff, log, show, blame, add, commit). No push, rebase or reset.",
        "parameters": {
            "type": "object",
            "properties": {
                "subcommand": {"type": "string", "enum": ["status", "diff", "log", "show", "blame", "add", "commit"]},
                "args": {"type": "array", "items": {"type": "string"}},
                "message": {"type": "string"},
            },
            "required": ["subcommand"],
        },
    },
    {
        "name": "todo_write",
        "description": "Replace the session's task list to plan multi-step work; one item in_progress at a time.",
        "parameters": {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "content": {"type": "string"},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                        },
                        "required": ["id", "content", "status"],
                    },
                },
            },
            "required": ["items"],
        },
    },
]

BASE = """You are Forge, an autonomous coding agent working inside a developer's repository. You solve \
software engineering tasks end to end: you read code, make focused changes, run the tests, and report what \
you did. You work through the tools listed below; you cannot see the repository any other way.

# Principles
- Understand before you change. Read the relevant files and search for usages before editing. Never guess \
at file contents, function signatures or configuration values you have not seen.
- Keep changes minimal and in the style of the surrounding code: naming, error handling, logging, comments \
and formatting follow what is already there. Do not reformat unrelated code.
- Prefer editing existing files over creating new ones. Never create documentation files unless asked.
- After every change, run the narrowest test that exercises it, then the wider suite before you finish.
- When a test fails, read the failure output carefully and fix the cause, not the symptom. Do not weaken or \
delete tests to make them pass.
- Never commit secrets, credentials or generated artefacts. Never run destructive commands (rm -rf, git \
reset --hard, force pushes) and never touch files outside the workspace.
- If the task is ambiguous or a decision has product impact, stop and ask the user one precise question.

# Working style
Plan with todo_write when there are more than two steps; explore with list_dir, glob, grep and read_file; \
change with edit_file; verify with run_tests; report in at most five lines.

# Output format
Each turn you either call tools or answer the user. To call a tool, emit one or more blocks of the form
<tool_call>
{"name": "<tool name>", "arguments": {<arguments as JSON>}}
</tool_call>
with arguments that validate against the tool's JSON schema. Emit nothing else in a turn that calls tools. \
Tool results come back in a <tool_response> block in the next user message. When you are done, answer in \
plain text without tool calls.

# Environment
- Workspace root: /workspace/ledgerline (a Python 3.11 service with a small Rust extension)
- Platform: linux x86_64, no network access except the package index mirror
- Test runner: pytest (configuration in pyproject.toml); Rust tests with cargo test in native/
- Formatting: ruff format and rustfmt; lint: ruff check, mypy --strict on src/

# Tools
You may call one or more of the following functions. Their signatures are JSON schemas inside <tools></tools>:
<tools>
"""

WORDS = ("ledger account entry balance journal posting currency rate invoice customer vendor payment "
         "batch export import schedule retry cache session token config report period audit close "
         "reconcile settle refund charge fee tax region store index query filter page cursor event "
         "queue worker backoff limit window snapshot delta merge split validate normalize").split()
DIRS = ["src/ledgerline/core", "src/ledgerline/api", "src/ledgerline/storage", "src/ledgerline/jobs",
        "src/ledgerline/util", "tests/unit", "tests/integration", "native/src"]


def _rng(seed):
    return random.Random(seed)


def _ident(r, n=2):
    return "_".join(r.choice(WORDS) for _ in range(n))


def _camel(r, n=2):
    return "".join(r.choice(WORDS).capitalize() for _ in range(n))


def _py_function(r):
    name = _ident(r, r.choice((2, 3)))
    args = [_ident(r, 1) for _ in range(r.randint(1, 3))]
    types = ["str", "int", "float", "bool", "Decimal", "list[str]", "dict[str, Any]"]
    sig = ", ".join("%s: %s" % (a, r.choice(types)) for a in dict.fromkeys(args))
    ret = r.choice(types + ["None"])
    a0 = args[0]
    body = [
        '    """%s the %s for %s.' % (r.choice(["Compute", "Validate", "Normalize", "Load", "Merge", "Resolve"]),
                                    _ident(r, 2).replace("_", " "), a0),
        "",
        "    Raises %sError when the %s is %s." % (_camel(r, 1), r.choice(WORDS),
                                                  r.choice(["missing", "stale", "out of range", "locked"])),
        '    """',
        "    if not %s:" % a0,
        '        raise %sError("%s: empty %s")' % (_camel(r, 1), name, a0),
        "    %s = %s(%s)" % (_ident(r, 1), _ident(r, 2), a0),
    ]
    for _ in range(r.randint(1, 4)):
        v = _ident(r, 1)
        body.append("    %s = %s.%s(%s, %s=%d)" % (v, _ident(r, 1), _ident(r, 2), a0, _ident(r, 1), r.randint(1, 500)))
        if r.random() < 0.5:
            body.append("    if %s is None:" % v)
            body.append('        log.warning("%s: no %s for %%s", %s)' % (name, r.choice(WORDS), a0))
            body.append("        return %s" % ("None" if ret == "None" else "%s()" % ret.split("[")[0]))
    body.append("    return %s" % ("None" if ret == "None" else _ident(r, 1)))
    return "def %s(%s) -> %s:\n%s\n" % (name, sig, ret, "\n".join(body))


def _py_file(r, path):
    lines = ['"""%s."""' % ("%s %s helpers" % (r.choice(WORDS).capitalize(), r.choice(WORDS))),
             "", "from __future__ import annotations", "",
             "import logging", "from decimal import Decimal", "from typing import Any", "",
             "from ledgerline.%s import %s, %sError" % (r.choice(["core", "storage", "util"]), _ident(r, 2),
                                                        _camel(r, 1)),
             "", "log = logging.getLogger(__name__)", ""]
    if r.random() < 0.5:
        lines += ["%s = %d" % (_ident(r, 2).upper(), r.randint(2, 4096)), ""]
    for _ in range(r.randint(2, 4)):
        lines += ["", _py_function(r)]
    return "\n".join(lines)


def _project_section(k):
    """k-th block of the project context: file excerpts, every 6th a file tree."""
    r = _rng(1000 + k)
    if k % 6 == 0:
        d = DIRS[(k // 6) % len(DIRS)]
        entries = sorted({"%s.py" % _ident(r, r.choice((1, 2))) for _ in range(r.randint(6, 12))})
        return "## Directory %s\n%s\n" % (d, "\n".join("- %s/%s (%d lines)" % (d, e, r.randint(20, 900))
                                                        for e in entries))
    d = r.choice(DIRS[:5])
    path = "%s/%s.py" % (d, _ident(r, 2))
    return "## File %s (excerpt)\n```python\n%s```\n" % (path, _py_file(r, path))


def system_prompt(target_tokens=1500, chars_per_token=None):
    """The coding-agent system prompt, about `target_tokens` tokens long.

    The base (rules + tools) is always included; the project context is appended
    block by block until the character budget is reached, then cut at a line
    boundary. Larger targets extend smaller ones (same prefix)."""
    cpt = chars_per_token or CHARS_PER_TOKEN
    text = BASE + "\n".join(json.dumps(t) for t in TOOLS) + "\n</tools>\n"
    budget = int(target_tokens * cpt)
    if len(text) + 1000 >= budget:  # within ~250 tokens of the target: the base alone (the ~1.5K variant)
        return text
    text += "\n# Project context\nThe following excerpts of the repository were gathered for you at session start.\n\n"
    k = 0
    while len(text) < budget:
        text += _project_section(k) + "\n"
        k += 1
    cut = text.rfind("\n", 0, budget)
    return text[: cut + 1] if cut > 0 else text[:budget]


AGENT_TASKS = [
    ("The test tests/unit/test_ledger_close.py::test_close_period_rounding fails: period totals are off by one "
     "cent when entries use three decimal places. Find the cause in src/ledgerline/core and fix it."),
    ("Add a --format json option to the `ledgerline report balances` CLI command. The default output must stay "
     "the current table; JSON output is a list of {account, currency, balance} objects with balances as strings."),
    ("Refactor src/ledgerline/api/client.py so that all requests go through one shared session with retry and "
     "exponential backoff (max 5 attempts), replacing the three ad-hoc retry loops. Keep the public API unchanged."),
    ("Write unit tests for src/ledgerline/util/schedule.py covering month-end, leap years and DST changes in "
     "next_run_at(); aim for full branch coverage and do not modify the module itself."),
]

_STEP_TOOLS = ["list_dir", "grep", "read_file", "read_file", "edit_file", "run_tests", "grep", "read_file",
               "edit_file", "run_tests", "git", "read_file"]


def agent_task(i):
    return AGENT_TASKS[i % len(AGENT_TASKS)]


def agent_step(i, k):
    """(assistant message, tool-result user message) for agent i's k-th step (deterministic)."""
    r = _rng(7919 * (i + 1) + k)
    tool = _STEP_TOOLS[(k + i) % len(_STEP_TOOLS)]
    d = DIRS[(i + k) % 5]
    path = "%s/%s.py" % (d, _ident(r, 2))
    if tool == "list_dir":
        args = {"path": d, "depth": 1}
        result = "\n".join("%s/%s.py  %d B" % (d, _ident(r, 2), r.randint(300, 40000)) for _ in range(r.randint(8, 14)))
    elif tool == "grep":
        sym = _ident(r, 2)
        args = {"pattern": "def %s|%s\\(" % (sym, sym), "path": "src", "include": "*.py"}
        result = "\n".join("%s/%s.py:%d:    %s = %s(%s)" % (r.choice(DIRS[:5]), _ident(r, 2), r.randint(5, 700),
                                                            _ident(r, 1), sym, _ident(r, 1))
                           for _ in range(r.randint(4, 9)))
    elif tool == "read_file":
        args = {"path": path, "offset": 1, "limit": 120}
        body = _py_file(r, path).splitlines()
        result = "\n".join("%4d  %s" % (n + 1, l) for n, l in enumerate(body))
    elif tool == "edit_file":
        old = "%s = %s(%s)" % (_ident(r, 1), _ident(r, 2), _ident(r, 1))
        args = {"path": path, "old_string": old, "new_string": old.replace("(", "(ctx, ", 1)}
        result = "Edited %s: 1 replacement at line %d." % (path, r.randint(10, 300))
    elif tool == "run_tests":
        args = {"target": "tests/unit", "fail_fast": True}
        n = r.randint(40, 300)
        if r.random() < 0.6:
            result = ("============ %d passed, 1 failed in %.2fs ============\nFAILED tests/unit/test_%s.py::test_%s\n"
                      "    assert %s == Decimal('%d.%02d')\nE   AssertionError: got Decimal('%d.%02d')"
                      % (n, r.random() * 9, _ident(r, 1), _ident(r, 2), _ident(r, 1), r.randint(1, 99),
                         r.randint(0, 99), r.randint(1, 99), r.randint(0, 99)))
        else:
            result = "============ %d passed in %.2fs ============" % (n, r.random() * 9)
    else:
        args = {"subcommand": "diff", "args": ["--stat"]}
        result = "\n".join(" %s | %d %s" % (path, r.randint(1, 30), "+" * r.randint(1, 12)) for _ in range(3))
    call = "<tool_call>\n%s\n</tool_call>" % json.dumps({"name": tool, "arguments": args})
    return ({"role": "assistant", "content": call},
            {"role": "user", "content": "<tool_response>\n%s\n</tool_response>" % result})


def agent_messages(sys_text, i, n_steps):
    """Messages for agent i's request after n_steps completed steps."""
    msgs = [{"role": "system", "content": sys_text}, {"role": "user", "content": agent_task(i)}]
    for k in range(n_steps):
        msgs.extend(agent_step(i, k))
    return msgs


DECODE_USER = ("Create the file src/ledgerline/util/currency_table.py by calling write_file. The content must be a "
               "complete Python module with a module docstring, a frozen dataclass Currency(code, name, "
               "minor_units, symbol), a dict CURRENCIES with at least twenty real ISO 4217 currencies, and "
               "functions lookup(code) and format_amount(amount, code) with docstrings. Respond only with the "
               "tool call.")

THROUGHPUT_TOPICS = ["double-entry bookkeeping", "exponential backoff with jitter", "LRU cache eviction",
                     "idempotent payment APIs", "database connection pooling", "ISO 4217 minor units",
                     "cron expression parsing", "optimistic locking", "write-ahead logging", "rate limiting",
                     "consistent hashing", "event sourcing", "bloom filters", "two-phase commit",
                     "B-tree indexes", "HTTP keep-alive"]


def throughput_messages(j, level=0, rep=0):
    """Stream j's prompt at a stream count (`level`); repetition `rep` > 0 (interleaved
    runs) changes its last words, so no engine serves a whole repeated prompt from cache."""
    topic = THROUGHPUT_TOPICS[j % len(THROUGHPUT_TOPICS)]
    again = ", repeat %d" % rep if rep else ""
    return [{"role": "system", "content": "You are a helpful senior software engineer. Answer in detail."},
            {"role": "user", "content": "Explain %s to a new team member in about 400 words, with a short "
                                        "Python example. (request %d of batch %d%s)" % (topic, j + 1, level, again)}]


PREFIX_QUESTIONS = [
    "Which tool would you call first to find where account balances are computed? Answer in one sentence.",
    "Name two rules from your instructions about testing. Answer briefly.",
    "What is the workspace root? Answer with the path only.",
    "Which tool edits an existing file? Answer with its name only.",
]


INTERFERENCE_USER = ("Write a long, complete Python module implementing an in-memory key-value store with "
                     "expiry, snapshots and a command-line interface. Include docstrings and tests. "
                     "(stream %d)")
