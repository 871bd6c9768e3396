#!/usr/bin/env python3
"""A webhook receiver for the relay's tests (Python standard library only).

    receiver.py PORT LOGFILE

Listens on 127.0.0.1:PORT and appends every request to LOGFILE as one JSON
line: {"method", "path", "headers" (names lower-cased), "body", "status",
"t" (unix time of receipt)}. It answers 200 unless told otherwise:

    POST /__control {"fail": [503, 503], "retry_after": 1}
        the next requests answer these codes in order (with Retry-After
        when retry_after is given), then 200 again;
    POST /__control {"always": 400}
        every request answers 400 until told {"always": null};
    GET /__health
        answers 200.

Requests to /__control and /__health are not logged.
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
LOGFILE = sys.argv[2]
lock = threading.Lock()
state = {"fail": [], "retry_after": None, "always": None}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, body=b"", extra=None):
        self.send_response(code)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(200, b"ok\n")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/__control":
            ctl = json.loads(body or b"{}")
            with lock:
                if "fail" in ctl:
                    state["fail"] = list(ctl["fail"])
                if "retry_after" in ctl:
                    state["retry_after"] = ctl["retry_after"]
                if "always" in ctl:
                    state["always"] = ctl["always"]
            self.reply(200, b"ok\n")
            return
        with lock:
            if state["always"]:
                code = int(state["always"])
            elif state["fail"]:
                code = int(state["fail"].pop(0))
            else:
                code = 200
            extra = {}
            if code != 200 and state["retry_after"] is not None:
                extra["Retry-After"] = str(state["retry_after"])
            rec = {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body.decode("utf-8", "replace"),
                "status": code,
                "t": time.time(),
            }
            with open(LOGFILE, "a") as f:
                f.write(json.dumps(rec) + "\n")
        self.reply(code, b"ok\n" if code == 200 else b"no\n", extra)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Server(("127.0.0.1", PORT), Handler).serve_forever()
