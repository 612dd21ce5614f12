#!/usr/bin/env python3
"""Decode speed of running streams while another request sends images (issue 32).

N streams decode (streaming chat completions, long outputs, restarted when one
ends) on `tempo9 serve` with a vision projector. The decode rate is read from
the server's own counter (`tempo9_engine_generated_tokens_total`, per second of
wall time) over two windows of equal length:

  quiet   no images;
  images  one more client sends a new image (fresh pixels, so never a cache
          hit) every --image-every seconds, each a one-token chat completion.

The ratio images/quiet is what the image requests cost the running streams:
their encodes and the prefill of their tokens. A variant whose name starts
with "text" sends, instead of images, new text prompts of the same token count
(the prefill alone, no encode), to tell the two apart. Each --variant is one server (its flags after the name), so the same
harness compares the encoder inside the decode step (--vision-inline), on its
own thread and GPU stream (--vision-device same), and on the CPU cores
(--vision-device cpu). Leading NAME=VALUE words of a variant's flags set the
server's environment, e.g. "stream-noprio:GGML_CUDA_STREAM_PRIORITY=0 --vision-device
same" (decode streams at the default priority). Per variant it also reports the encode time per image
from `tempo9_engine_image_encode_seconds_total`, and the image requests'
latency.

With --llama-mtmd-cli BIN, llama.cpp's llama-mtmd-cli encodes --llama-images
images of the same size in one prompt on the same files, and its "image slice
encoding done in N ms" lines give llama.cpp's encode time. Or with --llama-server DIR, llama.cpp's llama-server from that directory encodes
the same images alone on the same files (`--mmproj`, --llama-args); its log
(verbosity 4) gives the encode time: from "encoding mtmd batch" to "decoding
image batch".

A variant named llama* runs llama.cpp's llama-server (--llama-server DIR) with
the same clients, a slot for each: it encodes an image inside its one
decoding loop, so its streams wait while it does. Its rates are the clients'
streamed chunks (one per token); Tempo9's rows give that client-side ratio as
well ("client_ratio", the one the medians use), next to its own counter's.

Standard library only (it runs on the GPU machine). One JSON line per variant
on stdout, and a summary on stderr.

    python3 bench/vision/encode_while_decode.py --tempo9 target/release/tempo9 \\
        --gguf qwen3-vl-30b-a3b.gguf --mmproj mmproj.gguf --device cuda \\
        --variant "inline:--vision-device same --vision-inline" \\
        --variant "stream:--vision-device same" --variant "cpu:--vision-device cpu"
"""

import argparse
import base64
import http.client
import json
import os
import re
import shlex
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import zlib


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def png(w, h, salt):
    """A w×h RGB PNG whose pixels depend on `salt` (each image is new to the
    encoder's and the prefix cache's pixel hashes)."""
    rows = bytearray()
    for y in range(h):
        rows.append(0)
        for x in range(w):
            rows += bytes(((x * 7 + salt * 13) & 255, (y * 5 + salt * 29) & 255, ((x ^ y) + salt) & 255))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(rows), 1)) + chunk(b"IEND", b""))


def image_question(text, w, h, salt):
    """A user message asking `text` about a new w×h PNG (pixels from `salt`)."""
    url = "data:image/png;base64," + base64.b64encode(png(w, h, salt)).decode()
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": url}}]}


def stop_server(proc):
    """Ends a server started with Popen (killed if it does not stop in 60 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def post(port, path, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError("%s %d: %s" % (path, r.status, data[:300]))
    return json.loads(data)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("tempo9_engine_") and " " in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def wait_health(port, proc, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %s" % proc.returncode)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not healthy after %d s" % timeout)


class Streamer(threading.Thread):
    """One decoding client: streaming completions of a long answer, back to back."""

    def __init__(self, port, i, max_tokens, stop):
        super().__init__(daemon=True)
        self.port, self.i, self.max_tokens, self.stop = port, i, max_tokens, stop
        self.errors = 0
        # Streamed chunks with answer text: one per token in both engines (the
        # client-side count is what compares Tempo9 with llama-server).
        self.chunks = 0

    def run(self):
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "Stream %d: write a long story about the sea." % self.i}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        while not self.stop.is_set():
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
                c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
                r = c.getresponse()
                while not self.stop.is_set():
                    line = r.readline()
                    if not line or line.strip() == b"data: [DONE]":
                        break
                    # Answer or reasoning text (a random model may open a think block).
                    if line.startswith(b"data: {") and b'content":"' in line and b'content":""' not in line:
                        self.chunks += 1
                c.close()
            except OSError:
                self.errors += 1
                time.sleep(0.2)


def text_of(words, k):
    """A prompt of `words` words that shares no prefix with another `k`'s."""
    return "%d " % k + " ".join("w%dx%d" % (k, i) for i in range(words))


def imager(port, every, size, stop, lat, salt0, text_words=None):
    """Sends a new image (or, with `text_words`, a new text prompt of that many
    words instead) every `every` seconds until `stop`, one request at a time
    (the next starts at the later of its time and the previous answer);
    records latencies."""
    k = salt0
    nxt = time.time()
    while not stop.is_set():
        k += 1
        if text_words is None:
            message = image_question("What is in this picture?", size[0], size[1], k)
        else:
            message = {"role": "user", "content": text_of(text_words, k)}
        body = {
            "model": "m",
            "messages": [message],
            "max_tokens": 1,
            "temperature": 0,
        }
        t0 = time.time()
        try:
            post(port, "/v1/chat/completions", body)
            lat.append(time.time() - t0)
        except (OSError, RuntimeError) as e:
            print("image request failed: %s" % e, file=sys.stderr)
        nxt += every
        time.sleep(max(0.0, nxt - time.time()))


def window(port, seconds, streams, llama=False):
    """Counter deltas over a window: Tempo9's generated tokens, images encoded and
    encode seconds (not for llama-server), and the streams' client-side chunks."""
    a = {} if llama else metrics(port)
    c0 = sum(s.chunks for s in streams)
    t0 = time.time()
    time.sleep(seconds)
    b = {} if llama else metrics(port)
    dt = time.time() - t0
    d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}
    d["client_chunks"] = sum(s.chunks for s in streams) - c0
    return dt, d


def run_variant(args, name, flags):
    """One server configuration. A name starting with "llama" runs llama.cpp's
    llama-server from --llama-server instead (FLAGS are its own, e.g. the device),
    with a slot per client; its decode rates are the clients' streamed chunks."""
    port = free_port()
    llama = name.startswith("llama")
    words = shlex.split(flags)
    env_words = []
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        env_words.append(words.pop(0))
    flags = shlex.join(words)
    env = dict(os.environ, **dict(w.split("=", 1) for w in env_words)) if env_words else None
    if llama:
        if not args.llama_server:
            raise SystemExit("variant %s needs --llama-server DIR" % name)
        cmd = [os.path.join(args.llama_server, "llama-server"), "-m", args.gguf, "--mmproj", args.mmproj,
               "--host", "127.0.0.1", "--port", str(port), "-np", str(args.streams + 1),
               "-c", str(8192 * (args.streams + 1)), "--no-webui"] + shlex.split(flags)
        env = dict(env or os.environ, LD_LIBRARY_PATH=args.llama_server)
    else:
        cmd = [args.tempo9, "serve", "--gguf", args.gguf, "--mmproj", args.mmproj, "--device", args.device,
               "--host", "127.0.0.1", "--port", str(port)] + shlex.split(flags)
    log = open(os.path.join(args.log_dir, "%s-%s.log" % ("llama" if llama else "tempo9", name)), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_health(port, proc, 600)
        # Warm: one image request (the encoder's first graph and allocations).
        first = {"model": "m", "max_tokens": 1,
                 "messages": [image_question("warm", args.size[0], args.size[1], 99_999)]}
        warm = post(port, "/v1/chat/completions", first)
        text_words = None
        if name.startswith("text"):
            # Text prompts as long as the image requests' (same prefill work, no encode).
            want = warm["usage"]["prompt_tokens"]
            probe = post(port, "/v1/chat/completions", {"model": "m", "max_tokens": 1, "messages": [
                {"role": "user", "content": text_of(200, 777_777)}]})
            per_word = probe["usage"]["prompt_tokens"] / 200
            text_words = max(1, int(want / per_word))
        stop = threading.Event()
        streams = [Streamer(port, i, args.max_tokens, stop) for i in range(args.streams)]
        for s in streams:
            s.start()
        time.sleep(args.warm_s)
        quiet_dt, quiet = window(port, args.window_s, streams, llama)
        lat = []
        istop = threading.Event()
        it = threading.Thread(target=imager, args=(port, args.image_every, args.size, istop, lat, 0, text_words),
                              daemon=True)
        it.start()
        time.sleep(min(2.0, args.image_every))
        img_dt, img = window(port, args.window_s, streams, llama)
        istop.set()
        it.join(timeout=120)
        stop.set()
        for s in streams:
            s.join(timeout=60)
        gen = "tempo9_engine_generated_tokens_total"
        enc_n = img.get("tempo9_engine_images_encoded_total", 0.0)
        enc_s = img.get("tempo9_engine_image_encode_seconds_total", 0.0)
        # Each image request also generates one token (not streamed: not a chunk).
        quiet_rate = quiet.get(gen, 0.0) / quiet_dt
        img_rate = (img.get(gen, 0.0) - enc_n) / img_dt
        quiet_client = quiet["client_chunks"] / quiet_dt
        img_client = img["client_chunks"] / img_dt
        if llama:
            quiet_rate, img_rate = quiet_client, img_client
        return {
            "variant": name,
            "flags": flags,
            "streams": args.streams,
            "image": "%dx%d" % tuple(args.size) if text_words is None else None,
            "text_control_words": text_words,
            "image_request_prompt_tokens": warm["usage"]["prompt_tokens"],
            "image_every_s": args.image_every,
            "window_s": args.window_s,
            "decode_tok_s_quiet": round(quiet_rate, 1),
            "decode_tok_s_images": round(img_rate, 1),
            "ratio": round(img_rate / quiet_rate, 3) if quiet_rate else None,
            "client_chunks_s_quiet": round(quiet_client, 1),
            "client_chunks_s_images": round(img_client, 1),
            "client_ratio": round(img_client / quiet_client, 3) if quiet_client else None,
            "images_sent": len(lat),
            "images_encoded": int(enc_n),
            "encode_ms_mean": round(1000 * enc_s / enc_n, 1) if enc_n else None,
            "image_request_s_median": round(statistics.median(lat), 3) if lat else None,
            "stream_errors": sum(s.errors for s in streams),
        }
    finally:
        stop_server(proc)
        log.close()


def log_seconds(stamp):
    """llama.cpp's log time stamp (minutes.seconds.milliseconds.microseconds)."""
    m, sec, ms, us = (int(x) for x in stamp.split("."))
    return m * 60 + sec + ms / 1e3 + us / 1e6


def encode_ms_from_log(text):
    """Encode times from llama-server's log (verbosity 4): from "encoding mtmd
    batch" (the image's chunk starts: encode) to the next "decoding image batch"
    (its embeddings go into the language model)."""
    out, start = [], None
    for line in text.splitlines():
        m = re.match(r"(\d+\.\d+\.\d+\.\d+) ", line)
        if not m:
            continue
        if "encoding mtmd batch" in line:
            start = log_seconds(m.group(1))
        elif "decoding image batch" in line and start is not None:
            out.append(round(1000 * (log_seconds(m.group(1)) - start), 1))
            start = None
    return out


def llama_encode(args):
    """llama.cpp's encode time for the same-sized images on the same files."""
    port = free_port()
    exe = os.path.join(args.llama_server, "llama-server")
    cmd = [exe, "-m", args.gguf, "--mmproj", args.mmproj, "--host", "127.0.0.1", "--port", str(port),
           "-c", "8192", "-np", "1", "-lv", "4"] + shlex.split(args.llama_args)
    path = os.path.join(args.log_dir, "llama-server.log")
    log = open(path, "w")
    env = dict(os.environ, LD_LIBRARY_PATH=args.llama_server)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_health(port, proc, 600)
        lat = []
        for k in range(args.llama_images):
            t0 = time.time()
            post(port, "/v1/chat/completions", {"model": "m", "max_tokens": 1, "temperature": 0, "messages": [
                image_question("What is in this picture?", args.size[0], args.size[1], 50_000 + k)]})
            lat.append(time.time() - t0)
    finally:
        stop_server(proc)
        log.close()
    ms = encode_ms_from_log(open(path).read())
    # The first encode includes the graph's first allocation: the rest are steady.
    steady = ms[1:] or ms
    return {
        "variant": "llama.cpp",
        "image": "%dx%d" % tuple(args.size),
        "images_encoded": len(ms),
        "encode_ms_all": ms,
        "encode_ms_median_after_first": statistics.median(steady) if steady else None,
        "image_request_s_median": round(statistics.median(lat[1:] or lat), 3) if lat else None,
    }


def mtmd_encode(args):
    """llama.cpp's encode time from llama-mtmd-cli: the same-sized images in
    one prompt, each encoded in turn ("image slice encoded in N ms")."""
    paths = []
    for k in range(args.llama_images):
        p = os.path.join(args.log_dir, "image-%d.png" % k)
        with open(p, "wb") as f:
            f.write(png(args.size[0], args.size[1], 50_000 + k))
        paths.append(p)
    # The synthetic file has no chat template: ChatML, as Qwen's.
    cmd = [args.llama_mtmd_cli, "-m", args.gguf, "--mmproj", args.mmproj, "-p", "What is in these pictures?",
           "-n", "1", "-c", "16384", "--temp", "0", "--chat-template", "chatml",
           "--image", ",".join(paths)] + shlex.split(args.llama_args)
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(args.llama_mtmd_cli))
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.time() - t0
    text = r.stdout + r.stderr
    with open(os.path.join(args.log_dir, "llama-mtmd-cli.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + text)
    # "mtmd batch encoding done in N ms" (older builds: "image slice encoded in N ms").
    ms = [float(m) for m in re.findall(r"(?:encoding done|slice encoded) in (\d+(?:\.\d+)?) ms", text)]
    steady = ms[1:] or ms
    return {
        "variant": "llama.cpp (llama-mtmd-cli)",
        "image": "%dx%d" % tuple(args.size),
        "rc": r.returncode,
        "images_encoded": len(ms),
        "encode_ms_all": ms,
        "encode_ms_median_after_first": statistics.median(steady) if steady else None,
        "wall_s": round(wall, 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tempo9", required=True, help="the tempo9 binary")
    ap.add_argument("--gguf", required=True, help="vision-language model (e.g. qwen3-vl-30b-a3b preset)")
    ap.add_argument("--mmproj", required=True, help="its projector")
    ap.add_argument("--device", default="cuda", help="the language model's device (serve --device)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:FLAGS, a server configuration (repeatable)")
    ap.add_argument("--streams", type=int, default=4, help="decoding streams")
    ap.add_argument("--max-tokens", type=int, default=4096, help="per streamed answer")
    ap.add_argument("--image-every", type=float, default=1.0, help="seconds between images")
    ap.add_argument("--size", default="768x768", help="image size WxH")
    ap.add_argument("--warm-s", type=float, default=5.0, help="decode before the first window")
    ap.add_argument("--window-s", type=float, default=15.0, help="length of each window")
    ap.add_argument("--llama-server", help="directory with llama.cpp's llama-server (its encode time alone "
                    "with --llama-encode, and the server of variants named llama*)")
    ap.add_argument("--llama-encode", action="store_true",
                    help="also measure llama-server's encode time alone (--llama-server)")
    ap.add_argument("--llama-mtmd-cli", help="llama.cpp's llama-mtmd-cli binary (encode time)")
    ap.add_argument("--llama-args", default="-ngl 99", help="extra flags of llama.cpp's tool")
    ap.add_argument("--llama-images", type=int, default=4, help="images llama.cpp encodes")
    ap.add_argument("--reps", type=int, default=1,
                    help="repetitions of the variant list, alternating its order; medians at the end")
    ap.add_argument("--log-dir", default=".", help="server logs go here")
    args = ap.parse_args()
    args.size = tuple(int(x) for x in args.size.lower().split("x"))
    os.makedirs(args.log_dir, exist_ok=True)
    ratios = {}
    for rep in range(args.reps):
        order = args.variant if rep % 2 == 0 else args.variant[::-1]
        for v in order:
            name, _, flags = v.partition(":")
            r = run_variant(args, name, flags)
            r["rep"] = rep
            ratios.setdefault(name, []).append(r["client_ratio"])
            print(json.dumps(r), flush=True)
            print("%-10s quiet %7.1f tok/s  images %7.1f tok/s  ratio %.3f (client %.3f)  encode %s ms (%d of %d sent)" % (
                name, r["decode_tok_s_quiet"], r["decode_tok_s_images"], r["ratio"] or 0, r["client_ratio"] or 0,
                r["encode_ms_mean"], r["images_encoded"], r["images_sent"]), file=sys.stderr)
    if args.reps > 1:
        med = {k: statistics.median(x for x in v if x is not None) for k, v in ratios.items()}
        print(json.dumps({"median_ratio": med, "reps": args.reps}), flush=True)
        print("median ratios: %s" % med, file=sys.stderr)
    if args.llama_mtmd_cli:
        r = mtmd_encode(args)
        print(json.dumps(r), flush=True)
        print("llama.cpp  encode %s ms (median after the first; %d images)" % (
            r["encode_ms_median_after_first"], r["images_encoded"]), file=sys.stderr)
    if args.llama_server and args.llama_encode:
        r = llama_encode(args)
        print(json.dumps(r), flush=True)
        print("llama.cpp  encode %s ms (median after the first; %d images)" % (
            r["encode_ms_median_after_first"], r["images_encoded"]), file=sys.stderr)


if __name__ == "__main__":
    main()
