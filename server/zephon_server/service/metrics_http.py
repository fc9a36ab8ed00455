"""Prometheus ``/metrics`` over HTTP or HTTPS, optionally behind a bearer token or basic auth.

``prometheus_client.start_http_server`` serves TLS but no authentication, and it runs the TLS
handshake in its accept loop, where one silent client stalls every scrape. This module serves
the same exposition (``prometheus_client.make_wsgi_app``) from a small ``wsgiref`` server:

* One thread per connection, at most :data:`MAX_CONNECTIONS` at once (more are closed at
  once); each connection has a socket timeout and a total deadline, serves one request
  (HTTP/1.0) and may send at most :data:`MAX_REQUEST_HEAD` bytes of request line and headers
  (431 beyond) and no body (413).
* TLS (the gRPC port's certificate and key, and its client CA for mutual TLS when given) is
  negotiated in the connection's thread, so a client that never finishes it only holds its
  own slot.
* With a bearer token and/or basic-auth users configured, every request must carry one of
  them (``Authorization`` header, compared in constant time over SHA-256 digests); otherwise
  it gets ``401`` with ``WWW-Authenticate`` and never the metrics.

The command line turns ``zephon serve``'s ``--metrics-*`` flags (and ``ZEPHON_METRICS_TOKEN``)
into a frozen :class:`MetricsHTTPConfig` (:func:`zephon_server.serve_flags.metrics_config`);
:class:`MetricsHTTPServer` binds it (errors at start-up name the flag) and
:meth:`MetricsHTTPServer.start` serves.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import socket
import socketserver
import ssl
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from ..engine.errors import ZephonError

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 16
"""Connections served at once; a scraper needs one, a few humans with curl a few more."""
MAX_REQUEST_HEAD = 16 * 1024
"""Bytes of request line plus headers a request may send."""
SOCKET_TIMEOUT = 10.0
"""Seconds a connection may stay silent (reading the request, or during the TLS handshake)."""
REQUEST_DEADLINE = 30.0
"""Seconds a connection may last in all; then its socket is shut down."""
REALM = "zephon-metrics"
SERVER = "zephon-metrics"


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricsHTTPConfig:
    """Where and how ``/metrics`` is served.

    ``certfile``/``keyfile`` (together) turn on TLS, ``client_cafile`` (only with them) also
    requires client certificates signed by it. ``token`` and ``users`` (``(user, password)``
    pairs) are the accepted credentials; with neither, requests need none. Secrets are kept
    out of the ``repr``.
    """

    host: str
    port: int
    certfile: str | None = None
    keyfile: str | None = None
    client_cafile: str | None = None
    token: str | None = field(default=None, repr=False)
    users: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ValueError(f"port must be an integer, got {self.port!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together (TLS)")
        if self.client_cafile is not None and self.certfile is None:
            raise ValueError("client_cafile needs certfile and keyfile (mutual TLS needs TLS)")
        if self.token is not None and not self.token:
            raise ValueError("token must not be empty (None: no bearer token)")
        for user, password in self.users:
            if not user or ":" in user or not password:
                raise ValueError(
                    f"users: {user!r} needs a non-empty name without ':' and a password"
                )

    @property
    def tls(self) -> bool:
        """Whether /metrics is served over HTTPS."""
        return self.certfile is not None

    @property
    def schemes(self) -> list[str]:
        """The authentication schemes requests may use (empty: none needed)."""
        return (["Bearer"] if self.token else []) + (["Basic"] if self.users else [])

    @property
    def loopback(self) -> bool:
        """Whether only this host can connect (the host is a loopback address)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def read_users(path: str) -> tuple[tuple[str, str], ...]:
    """The ``user:password`` lines of a basic-auth file (blank lines and ``#`` comments are
    skipped); raises :class:`ZephonError` naming the file and line of a bad one."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
        mode = where.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ZephonError(f"--metrics-basic-auth-file {path}: cannot read it: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("--metrics-basic-auth-file %s can be read by other users; chmod 600 it", path)
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise ZephonError(
                f"--metrics-basic-auth-file {path} line {number}: expected 'user:password' "
                "(a name without ':' and a non-empty password)"
            )
        if user in users:
            raise ZephonError(
                f"--metrics-basic-auth-file {path} line {number}: user {user!r} appears twice"
            )
        users[user] = password
    if not users:
        raise ZephonError(
            f"--metrics-basic-auth-file {path}: no 'user:password' line (an empty file would "
            "lock every scraper out)"
        )
    return tuple(users.items())


# --------------------------------------------------------------------------------------------
# authentication
# --------------------------------------------------------------------------------------------


def _digest(value: str | bytes) -> bytes:
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return hashlib.sha256(data).digest()


class Authenticator:
    """Checks an ``Authorization`` header against the configured credentials.

    Secrets are compared as SHA-256 digests with :func:`hmac.compare_digest`, so neither their
    content nor their length shows in the time taken; every basic-auth user is checked.
    """

    def __init__(self, token: str | None, users: Iterable[tuple[str, str]]) -> None:
        self._token = _digest(token) if token else None
        self._users = [(_digest(u), _digest(p)) for u, p in users]

    @property
    def required(self) -> bool:
        return self._token is not None or bool(self._users)

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Authorization`` header value may read the metrics."""
        if not self.required:
            return True
        if not header:
            return False
        scheme, _, value = header.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and self._token is not None:
            return hmac.compare_digest(_digest(value), self._token)
        if scheme == "basic" and self._users:
            try:
                decoded = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return False
            user, sep, password = decoded.partition(b":")
            if not sep:
                return False
            wanted = (_digest(user), _digest(password))
            found = False
            for entry in self._users:
                found |= hmac.compare_digest(wanted[0], entry[0]) & hmac.compare_digest(
                    wanted[1], entry[1]
                )
            return found
        return False


def make_app(
    registry: CollectorRegistry, authenticator: Authenticator, schemes: list[str]
) -> Callable[..., Any]:
    """The WSGI app: refuse bodies (413) and unauthenticated requests (401), then hand the
    request to ``prometheus_client``'s exposition app."""
    metrics = make_wsgi_app(registry)
    challenge = [("WWW-Authenticate", f'{s} realm="{REALM}"') for s in schemes]
    hint = " or ".join(
        {"Bearer": "'Authorization: Bearer <token>'", "Basic": "HTTP basic auth"}[s]
        for s in schemes
    )

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        def respond(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            # Our own Server header: wsgiref's would name the Python version.
            return start_response(status, [*headers, ("Server", SERVER)], *exc_info)

        length = environ.get("CONTENT_LENGTH") or "0"
        if length != "0" or environ.get("HTTP_TRANSFER_ENCODING"):
            respond("413 Content Too Large", [("Content-Type", "text/plain")])
            return [b"requests to /metrics carry no body\n"]
        if not authenticator.allows(environ.get("HTTP_AUTHORIZATION")):
            respond("401 Unauthorized", [("Content-Type", "text/plain"), *challenge])
            return [f"401 Unauthorized: /metrics needs {hint}\n".encode()]
        return list(metrics(environ, respond))

    return app


# --------------------------------------------------------------------------------------------
# the HTTP server
# --------------------------------------------------------------------------------------------


class _HeadTooLarge(Exception):
    pass


class _BoundedReader:
    """The request's input stream, failing once more than ``limit`` bytes were read."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def _count(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            raise _HeadTooLarge
        return data

    def readline(self, size: int = -1) -> bytes:
        cap = self._left + 1 if size < 0 else min(size, self._left + 1)
        return self._count(self._raw.readline(cap))

    def read(self, size: int = -1) -> bytes:
        cap = self._left + 1 if size < 0 else min(size, self._left + 1)
        return self._count(self._raw.read(cap))

    def close(self) -> None:
        self._raw.close()


class _Handler(WSGIRequestHandler):
    """wsgiref's handler with a bounded request head and its log lines at debug level."""

    server_version = SERVER
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.rfile = _BoundedReader(self.rfile, MAX_REQUEST_HEAD)  # type: ignore[assignment]

    def handle(self) -> None:
        try:
            super().handle()
        except _HeadTooLarge:
            with contextlib.suppress(OSError):
                self.wfile.write(
                    b"HTTP/1.0 431 Request Header Fields Too Large\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s: " + format, self.client_address[0], *args)


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], family: int, tls: ssl.SSLContext | None):
        self.address_family = family
        self._tls = tls
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._refused_logged = float("-inf")
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            now = time.monotonic()
            if now - self._refused_logged > 60:
                self._refused_logged = now
                log.warning(
                    "metrics: %d connections open, closing a new one from %s (logged once a "
                    "minute)",
                    MAX_CONNECTIONS,
                    client_address[0],
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(SOCKET_TIMEOUT)
        conn = [request]  # the TLS socket once the handshake is done
        timer = threading.Timer(REQUEST_DEADLINE, lambda: _cut(conn[0]))
        timer.daemon = True
        timer.start()
        try:
            if self._tls is not None:
                # The handshake after conn[0] is set: the deadline must reach it (wrapping
                # detaches the plain socket).
                conn[0] = self._tls.wrap_socket(
                    request, server_side=True, do_handshake_on_connect=False
                )
                try:
                    conn[0].do_handshake()
                except (OSError, ssl.SSLError) as exc:  # plain HTTP, untrusted client, silence
                    log.debug("metrics: TLS handshake with %s failed: %s", client_address[0], exc)
                    return
            self.RequestHandlerClass(conn[0], client_address, self)  # type: ignore[arg-type]
        finally:
            timer.cancel()
            if conn[0] is not request:
                with contextlib.suppress(OSError):
                    conn[0].close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or times out is not the server's error.
        log.debug("metrics: request from %s failed", client_address[0], exc_info=True)


def _cut(sock: socket.socket) -> None:
    """Shut a connection that outlived :data:`REQUEST_DEADLINE` (unblocks its thread).

    ``socket.socket.shutdown`` also for a TLS socket: its own ``shutdown`` would drop the TLS
    state under the thread still reading through it."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _tls_context(config: MetricsHTTPConfig) -> ssl.SSLContext | None:
    if not config.tls:
        return None
    assert config.certfile is not None and config.keyfile is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.certfile, config.keyfile)
        if config.client_cafile:
            context.load_verify_locations(cafile=config.client_cafile)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ZephonError(
            f"/metrics TLS: cannot load --tls-cert {config.certfile} / --tls-key "
            f"{config.keyfile}"
            + (f" / --tls-client-ca {config.client_cafile}" if config.client_cafile else "")
            + f": {exc}"
        ) from None
    return context


class MetricsHTTPServer:
    """``/metrics`` of ``registry`` as ``config`` says: binds on construction (so start-up
    fails early, naming the address), serves from :meth:`start` on a daemon thread."""

    def __init__(self, config: MetricsHTTPConfig, registry: CollectorRegistry) -> None:
        self.config = config
        try:
            family = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM)[0][0]
            self._httpd = _ThreadingWSGIServer(
                (config.host, config.port), family, _tls_context(config)
            )
        except OSError as exc:
            raise ZephonError(
                f"/metrics cannot listen on {config.host}:{config.port} ({exc}); check "
                "--metrics-host (an address of this machine, 0.0.0.0 for all) and "
                "--metrics-port (free, not privileged)"
            ) from None
        authenticator = Authenticator(config.token, config.users)
        self._httpd.set_app(make_app(registry, authenticator, config.schemes))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the one picked when ``config.port`` is 0)."""
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.config.tls else 'http'}://{host}:{self.port}/metrics"

    def start(self) -> None:
        """Serve on a daemon thread until :meth:`close`."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="zephon-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(5)
        self._httpd.server_close()


def describe(config: MetricsHTTPConfig) -> str:
    """What a request must bring, for the start-up log line."""
    needs = [{"Bearer": "a bearer token", "Basic": "basic auth"}[s] for s in config.schemes]
    text = " or ".join(needs)
    if config.client_cafile:
        return "needs a client certificate" + (f" and {text}" if text else "")
    return f"needs {text}" if text else "no authentication"
