#!/usr/bin/env python3
"""A recording HTTP proxy between an agent client and the Tempo9 server.

Forwards every request unchanged to UPSTREAM, streams the answer back, and
appends one JSON line per exchange to LOG (and a line per request, as it
arrives, to LOG.started): method, path, status, request body,
response body (the SSE text for streams), the time to the first response byte
and to the last, and the usage it finds in the answer (OpenAI, Responses and
Anthropic shapes). Nothing is rewritten: what breaks must be fixed in the server.

    python3 proxy.py PORT UPSTREAM_URL LOG_JSONL
"""

import http.client
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
UPSTREAM = urllib.parse.urlparse(sys.argv[2])
LOG = sys.argv[3]
LOCK = threading.Lock()
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-authorization", "proxy-authenticate", "host", "content-length"}


def usage_of(body: str):
    """The last usage object in a JSON or SSE answer."""
    found = None
    texts = [body]
    if "data:" in body:
        texts = [l[5:].strip() for l in body.splitlines() if l.startswith("data:")]
    for t in texts:
        try:
            v = json.loads(t)
        except ValueError:
            continue
        if not isinstance(v, dict):
            continue
        for u in (v.get("usage"), (v.get("message") or {}).get("usage"),
                  (v.get("response") or {}).get("usage")):
            if isinstance(u, dict):
                found = u
    return found


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _forward(self):
        t0 = time.time()
        n = int(self.headers.get("content-length") or 0)
        req_body = self.rfile.read(n) if n else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        with LOCK, open(LOG + ".started", "a") as f:
            f.write(json.dumps({"t_start": t0, "method": self.command, "path": self.path,
                                "request": req_body.decode("utf-8", "replace")}) + "\n")
        conn = http.client.HTTPConnection(UPSTREAM.hostname, UPSTREAM.port, timeout=3600)
        conn.request(self.command, self.path, body=req_body, headers=headers)
        resp = conn.getresponse()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        chunks, first = [], None
        while True:
            b = resp.read1(65536)
            if not b:
                break
            if first is None:
                first = time.time()
            chunks.append(b)
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                break
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        t1 = time.time()
        body = b"".join(chunks).decode("utf-8", "replace")
        try:
            req_json = json.loads(req_body) if req_body else None
        except ValueError:
            req_json = req_body.decode("utf-8", "replace")
        rec = {
            "t_start": t0, "method": self.command, "path": self.path,
            "request_headers": {k: v for k, v in headers.items()
                                if k.lower() not in ("authorization", "x-api-key")},
            "status": resp.status, "request": req_json, "response": body,
            "first_byte_s": round((first or t1) - t0, 3), "total_s": round(t1 - t0, 3),
            "usage": usage_of(body),
        }
        with LOCK, open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
