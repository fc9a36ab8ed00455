"""An HTTP fault proxy on 127.0.0.1 for object-storage tests (in front of a real S3 server).

``HttpFaultProxy(target_port)`` listens on a free loopback port and forwards every HTTP/1.1
request to ``127.0.0.1:target_port`` (keep-alive connections are kept). Faults are queued at
runtime and consumed by the next requests that match them:

* ``fail(n, status=503, code="SlowDown")``: answer the next ``n`` matching requests with that
  status and an S3 XML error body (``429``/``SlowDown``, ``500``/``InternalError``...),
  optionally running ``before()`` first (to change the object while the request is out);
* ``reset(n)``: forward the next ``n`` matching requests, then send the response's headers and
  half of its body and reset the connection (RST, ``SO_LINGER`` 0): a connection that dies
  mid-body;
* ``stall(n, hold)``: the same half body, then nothing more for ``hold`` seconds while the
  connection stays open (a server that stops sending without closing), then a close.

A fault matches a request by method (``methods``, default every method) and by a substring
of its path (``path``). Every request is logged in :attr:`log` as a :class:`Logged` entry
(method, path, ``Range`` header, status answered, body bytes sent, whether a fault answered
it), which is how tests count GETs and their sizes.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


@dataclass(frozen=True)
class Logged:
    """One request the proxy saw."""

    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    fault: str | None

    def range_length(self) -> int | None:
        """The length a ``bytes=a-b`` range asks for (None without one)."""
        if not self.range or not self.range.startswith("bytes="):
            return None
        first, _, last = self.range[6:].partition("-")
        return int(last) - int(first) + 1


@dataclass
class _Fault:
    kind: str  # "fail", "reset" or "stall"
    left: int
    status: int
    code: str
    methods: frozenset[str] | None
    path: str | None
    before: Callable[[], None] | None = None
    hold: float = 0.0  # a stall's silence, in seconds

    def matches(self, method: str, path: str) -> bool:
        if self.left <= 0:
            return False
        if self.methods is not None and method not in self.methods:
            return False
        return self.path is None or self.path in path


class HttpFaultProxy:
    """A forwarding HTTP proxy with queued faults (context manager; :meth:`close` stops it)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.log: list[Logged] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()  # ends stalls early
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def fail(
        self,
        n: int,
        status: int = 503,
        code: str = "SlowDown",
        methods: Iterable[str] | None = None,
        path: str | None = None,
        before: Callable[[], None] | None = None,
    ) -> None:
        """Answer the next ``n`` matching requests with ``status`` and an S3 error ``code``
        (calling ``before()`` first, e.g. to change the object while the request is out)."""
        self._add(_Fault("fail", n, status, code, _methods(methods), path, before))

    def reset(self, n: int, methods: Iterable[str] | None = None, path: str | None = None) -> None:
        """Reset the next ``n`` matching requests' connections half-way through the body."""
        self._add(_Fault("reset", n, 0, "", _methods(methods), path))

    def stall(
        self, n: int, hold: float, methods: Iterable[str] | None = None, path: str | None = None
    ) -> None:
        """Send half of the next ``n`` matching responses' bodies, then hold the connection
        silent for ``hold`` seconds (or until :meth:`close`) before closing it."""
        self._add(_Fault("stall", n, 0, "", _methods(methods), path, hold=hold))

    def clear(self) -> None:
        """Drop the pending faults and the log."""
        with self._lock:
            self._faults.clear()
            self.log.clear()

    def requests(self, method: str | None = None, path: str | None = None) -> list[Logged]:
        """The logged requests, optionally only those of ``method`` whose path has ``path``."""
        with self._lock:
            return [
                r
                for r in self.log
                if (method is None or r.method == method) and (path is None or path in r.path)
            ]

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.left -= 1
                    return fault
        return None

    def _record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    def close(self) -> None:
        """Stop serving and join the accept thread."""
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> HttpFaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _methods(methods: Iterable[str] | None) -> frozenset[str] | None:
    return None if methods is None else frozenset(m.upper() for m in methods)


def _error_body(status: int, code: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected by the test proxy ({status})</Message>"
        "<RequestId>zephon-fault</RequestId></Error>"
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    """Forwards one request (or answers it with a fault)."""

    owner: HttpFaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _handle(self) -> None:
        method, path = self.command, self.path
        body = self._body()
        fault = self.owner._take(method, path)
        rng = self.headers.get("Range")
        if fault is not None and fault.kind == "fail":
            if fault.before is not None:
                fault.before()
            data = _error_body(fault.status, fault.code)
            # logged before answering: the client may look at the log as soon as it has it
            self.owner._record(Logged(method, path, rng, fault.status, len(data), "fail"))
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data)
            return
        status, headers, data = self._forward(method, path, body)
        kind = fault.kind if fault is not None else None
        sent = len(data) // 2 if kind in ("reset", "stall") else len(data)
        self.owner._record(Logged(method, path, rng, status, sent, kind))
        self.send_response(status)
        for key, value in headers:
            skip = key.lower() in _HOP or (key.lower() == "content-length" and method != "HEAD")
            if not skip:
                self.send_header(key, value)
        if method != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if kind == "reset":
            self.wfile.write(data[:sent])
            self.wfile.flush()
            self._reset()
        elif kind == "stall" and fault is not None:
            self.wfile.write(data[:sent])
            self.wfile.flush()
            self.owner._closing.wait(fault.hold)
            self.close_connection = True
        elif method != "HEAD":
            self.wfile.write(data)

    def _body(self) -> bytes:
        """The request body (``Content-Length`` or chunked transfer encoding)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(
        self, method: str, path: str, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.owner.target_port, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body and "content-length" not in {k.lower() for k in headers}:
                headers["Content-Length"] = str(len(body))
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    def _reset(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle
