"""A real S3-compatible server on 127.0.0.1 for the tests (moto's ThreadedMotoServer), with a
small HTTP proxy in front of it that injects faults for chosen keys: 503 answers, stalls,
truncated and altered bodies. Clients talk S3 over HTTP to the proxy; nothing is patched.
"""
from __future__ import annotations

import http.client
import logging
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "te", "trailer",
        "upgrade"}


@dataclass
class Fault:
    """Applied to the next `times` requests whose method is `method` and whose path contains
    `key`. kind: "503" (answer ServiceUnavailable), "403" (answer with the S3 error `code`:
    AccessDenied, InvalidAccessKeyId, …), "stall" (wait `seconds`, then answer), "truncate"
    (send `keep` bytes of the body, then close), "flip" (invert one byte of the body at
    `offset`), "pad" (send `keep` more bytes than the object has, announced in Content-Length:
    a server answering with more than asked for)."""

    key: str
    kind: str
    times: int = 1
    method: str = "GET"
    seconds: float = 0.0
    keep: int = 0
    offset: int = 0
    code: str = "AccessDenied"


class FaultProxy:
    def __init__(self, upstream: tuple):
        self.upstream = upstream
        self.faults: list[Fault] = []
        self.requests: list = []  # (method, path) of every request, as it arrives
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if not size:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _handle(self):
                body = self._body()
                proxy._log(self.command, self.path)
                fault = proxy._take(self.command, self.path)
                if fault is not None and fault.kind in ("503", "403"):
                    code = "ServiceUnavailable" if fault.kind == "503" else fault.code
                    msg = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>" \
                          "<Message>injected</Message></Error>".encode()
                    self.send_response(int(fault.kind))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if fault is not None and fault.kind == "stall":
                    time.sleep(fault.seconds)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                try:
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        # an altered body keeps no checksum header: the reader's own check must catch it
                        if k.lower() not in _HOP and not (fault is not None and fault.kind == "flip"
                                                          and k.lower().startswith("x-amz-checksum")):
                            self.send_header(k, v)
                    length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else len(data)
                    pad = fault.keep if fault is not None and fault.kind == "pad" and self.command == "GET" else 0
                    self.send_header("Content-Length", str(int(length) + pad))
                    if fault is not None and fault.kind == "truncate":
                        self.send_header("Connection", "close")
                        self.close_connection = True
                        data = data[:fault.keep]
                    elif fault is not None and fault.kind == "flip" and fault.offset < len(data):
                        data = bytearray(data)
                        data[fault.offset] ^= 0xFF
                        data = bytes(data)
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                        zeros = b"\0" * (1 << 20)
                        while pad > 0:  # streamed: the proxy itself never holds the padding
                            self.wfile.write(zeros[:pad])
                            pad -= len(zeros)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (stall)
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return "http://%s:%d" % self.server.server_address[:2]

    def add(self, *faults: Fault) -> None:
        with self.lock:
            self.faults.extend(faults)

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()
            self.requests.clear()

    def count(self, method: str, key: str) -> int:
        """Requests seen with this method whose path contains key."""
        with self.lock:
            return sum(1 for m, p in self.requests if m == method and key in p.split("?")[0])

    def _take(self, method: str, path: str):
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.method == method and f.key in path.split("?")[0]:
                    f.times -= 1
                    return f
        return None

    def _log(self, method, path):
        with self.lock:
            self.requests.append((method, path))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class S3:
    """moto's server + the fault proxy; `options` are the s3fs storage options that reach it."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.moto.start()
        self.proxy = FaultProxy(self.moto.get_host_and_port())
        # no retries inside botocore (the tests exercise recordtool's own); timeouts short enough
        # for a stall test, long enough for a loaded 2-core CI machine
        self.options = {"endpoint_url": self.proxy.url, "key": "testing", "secret": "testing",
                        "config_kwargs": {"retries": {"total_max_attempts": 1}, "read_timeout": 5.0,
                                          "connect_timeout": 5.0}}

    def stop(self) -> None:
        self.proxy.stop()
        self.moto.stop()
