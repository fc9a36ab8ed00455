"""A small TCP fault proxy on 127.0.0.1 for network-fault tests.

``FaultProxy(target_port)`` listens on a free loopback port and forwards every accepted
connection to ``127.0.0.1:target_port``. Faults are switched at runtime and apply to the
traffic flowing from then on:

* ``latency_ms``: every chunk is delivered that much later (a delay line per direction, so
  throughput is kept, only delay is added);
* ``bandwidth``: bytes per second per direction and connection (0: unlimited);
* ``reset_after_bytes``: a connection that has carried that many bytes from the server to the
  client is reset (RST to both peers, ``SO_LINGER`` 0); ``resets_left`` bounds how many
  connections get reset;
* ``blackhole()``: every connection open right now silently drops all traffic from then on in
  both directions (the sockets stay open, nothing is closed or answered: a dead peer only
  keepalive can detect); later connections are forwarded normally.

Every thread is a daemon, every wait has a timeout, and :meth:`close` closes every socket
and joins the threads (used as a context manager). Counters: ``connections``, ``resets``,
``bytes_up`` (client → server) and ``bytes_down``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import deque

CHUNK = 16 * 1024
POLL_S = 0.05


class _Pipe:
    """One direction of one connection: a reader thread feeding a delay line, a writer."""

    def __init__(
        self, proxy: FaultProxy, conn: _Conn, src: socket.socket, dst: socket.socket, up: bool
    ):
        self.proxy = proxy
        self.conn = conn
        self.src = src
        self.dst = dst
        self.up = up
        self.queue: deque[tuple[float, bytes]] = deque()
        self.cond = threading.Condition()
        self.eof = False
        name = "up" if up else "down"
        self.reader = threading.Thread(target=self._read, name=f"proxy-{name}-r", daemon=True)
        self.writer = threading.Thread(target=self._write, name=f"proxy-{name}-w", daemon=True)

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    def _read(self) -> None:
        try:
            while not self.conn.closed.is_set():
                try:
                    data = self.src.recv(CHUNK)
                except TimeoutError:
                    continue
                if not data:
                    break
                if self.conn.blackholed:
                    continue  # dropped on the floor
                due = time.monotonic() + self.proxy.latency_ms / 1000.0
                with self.cond:
                    self.queue.append((due, data))
                    self.cond.notify_all()
        except OSError:
            pass
        finally:
            with self.cond:
                self.eof = True
                self.cond.notify_all()

    def _write(self) -> None:
        try:
            while not self.conn.closed.is_set():
                with self.cond:
                    while not self.queue and not self.eof and not self.conn.closed.is_set():
                        self.cond.wait(POLL_S)
                    if not self.queue:
                        if self.eof:
                            break
                        continue
                    due, data = self.queue[0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        self.cond.wait(min(wait, POLL_S))
                        continue
                    self.queue.popleft()
                if self.conn.blackholed:
                    continue
                self._send(data)
            if not self.conn.closed.is_set() and not self.conn.blackholed:
                with contextlib.suppress(OSError):
                    self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            self.conn.close()
        if all(p.eof and not p.queue for p in self.conn.pipes):
            self.conn.close()  # both directions finished

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.conn.closed.is_set():
            rate = self.proxy.bandwidth
            piece = view[: max(1, min(len(view), rate // 20))] if rate else view
            self.dst.sendall(piece)
            view = view[len(piece) :]
            if self.up:
                self.proxy.bytes_up += len(piece)
            else:
                self.proxy.bytes_down += len(piece)
                self.conn.down += len(piece)
                limit = self.proxy.reset_after_bytes
                if limit and self.conn.down >= limit and self.proxy._take_reset():
                    self.conn.reset()
                    return
            if rate:
                time.sleep(len(piece) / rate)


class _Conn:
    """A proxied connection: client socket, upstream socket, two pipes."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        self.blackholed = False
        self.down = 0
        for sock in (client, upstream):
            sock.settimeout(POLL_S * 4)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pipes = [
            _Pipe(proxy, self, client, upstream, up=True),
            _Pipe(proxy, self, upstream, client, up=False),
        ]

    def start(self) -> None:
        for pipe in self.pipes:
            pipe.start()

    def reset(self) -> None:
        """Abort both sides with RST (SO_LINGER 0 then close)."""
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.proxy.resets += 1
        self.close()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.close()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for pipe in self.pipes:
            for thread in (pipe.reader, pipe.writer):
                if thread.is_alive() and thread is not threading.current_thread():
                    thread.join(max(0.0, deadline - time.monotonic()))


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target_port`` with switchable faults."""

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.latency_ms = 0.0
        self.bandwidth = 0
        self.reset_after_bytes = 0
        self.resets_left = 0
        self.connections = 0
        self.resets = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(POLL_S * 2)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    # -- faults ---------------------------------------------------------------------------

    def set(
        self,
        *,
        latency_ms: float | None = None,
        bandwidth: int | None = None,
        reset_after_bytes: int | None = None,
        resets: int | None = None,
    ) -> None:
        """Change faults for traffic from now on (``None`` keeps a setting)."""
        if latency_ms is not None:
            self.latency_ms = float(latency_ms)
        if bandwidth is not None:
            self.bandwidth = int(bandwidth)
        if reset_after_bytes is not None:
            self.reset_after_bytes = int(reset_after_bytes)
            with self._lock:
                for conn in self._conns:
                    conn.down = 0
        if resets is not None:
            self.resets_left = int(resets)

    def heal(self) -> None:
        """No faults for traffic from now on (black-holed connections stay dead)."""
        self.set(latency_ms=0, bandwidth=0, reset_after_bytes=0, resets=0)

    def blackhole(self) -> int:
        """Silently drop all traffic of every open connection; returns how many."""
        with self._lock:
            live = [c for c in self._conns if not c.closed.is_set()]
        for conn in live:
            conn.blackholed = True
        return len(live)

    def retarget(self, port: int) -> None:
        """Forward new connections to another port (a restarted server)."""
        self.target = (self.target[0], port)

    def _take_reset(self) -> bool:
        with self._lock:
            if self.resets_left <= 0:
                return False
            self.resets_left -= 1
            return True

    # -- plumbing -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # the server is down: the client sees a refused/closed socket
                continue
            conn = _Conn(self, client, upstream)
            with self._lock:
                self._conns = [c for c in self._conns if not c.closed.is_set()]
                self._conns.append(conn)
                self.connections += 1
            conn.start()

    def close(self) -> None:
        """Close the listener and every connection, join the threads (bounded)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(2)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.close()
        for conn in conns:
            conn.join(2)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
