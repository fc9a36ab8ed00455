"""``/metrics`` security: loopback by default, bearer/basic auth, TLS and mutual TLS, bounds.

The first tests start real ``zephon serve`` subprocesses and read ``/metrics`` with urllib
(what curl or Prometheus would do); the last ones serve an injected registry in-process to
check the bounds on connections, request heads and slow clients, and the flag checks.
"""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from zephon_server.service import metrics_http
from zephon_server.service.metrics_http import (
    MAX_CONNECTIONS,
    MAX_REQUEST_HEAD,
    MetricsHTTPConfig,
    MetricsHTTPServer,
)
from zephon_testing.scenarios.metrics_http import (
    TOKEN,
    get,
    run_metrics_auth,
    run_metrics_on_all_interfaces,
    run_metrics_on_loopback_by_default,
    run_metrics_tls,
)
from zephon_testing.scenarios.security import make_pki
from zephon_testing.servers import serve_once

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("metrics-pki"))


# --------------------------------------------------------------------------------------------
# real servers
# --------------------------------------------------------------------------------------------


def test_metrics_listen_on_loopback_by_default_even_with_host_0_0_0_0(tmp_path):
    run_metrics_on_loopback_by_default(tmp_path)


def test_metrics_on_all_interfaces_without_credentials_are_warned_about(tmp_path):
    run_metrics_on_all_interfaces(tmp_path)


def test_metrics_need_the_token_or_a_basic_auth_user(tmp_path):
    run_metrics_auth(tmp_path)


@pytest.mark.parametrize("mutual", [False, True])
def test_metrics_are_served_over_tls_with_the_grpc_certificate(tmp_path, pki, mutual):
    run_metrics_tls(tmp_path, pki, mutual)


def test_metrics_flag_mistakes_stop_the_start_naming_the_flag(tmp_path):
    bad = tmp_path / "users"
    bad.write_text("prometheus\n")
    for args, message in (
        (["--metrics-auth-token", "x"], "--metrics-auth-token needs --metrics-port"),
        (["--metrics-port", "0", "--metrics-tls", "on"], "--metrics-tls on needs --tls-cert"),
        (
            ["--metrics-port", "0", "--metrics-basic-auth-file", str(bad)],
            f"--metrics-basic-auth-file {bad} line 1: expected 'user:password'",
        ),
    ):
        res = serve_once(args, tmp_path)
        assert res.returncode == 2, res.stderr[-2000:]
        assert f"zephon: error: {message}" in res.stderr


# --------------------------------------------------------------------------------------------
# in-process: bounds and configuration
# --------------------------------------------------------------------------------------------


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("probe_total", "A counter to find in the output", registry=registry).inc()
    return registry


def start(registry, **kwargs) -> MetricsHTTPServer:
    srv = MetricsHTTPServer(MetricsHTTPConfig(host="127.0.0.1", port=0, **kwargs), registry)
    srv.start()
    return srv


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_request_bodies_and_oversized_heads_are_refused(registry):
    srv = start(registry, token=TOKEN)
    try:
        auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
        reply = raw_exchange(srv.port, b"GET /metrics HTTP/1.0\r\n" + auth + b"\r\n")
        assert reply.startswith(b"HTTP/1.0 200") and b"probe_total 1.0" in reply
        post = b"POST /metrics HTTP/1.0\r\n" + auth + b"Content-Length: 5\r\n\r\nhello"
        assert raw_exchange(srv.port, post).startswith(b"HTTP/1.0 413")
        big = b"GET /metrics HTTP/1.0\r\nX-Pad: " + b"a" * MAX_REQUEST_HEAD + b"\r\n\r\n"
        assert raw_exchange(srv.port, big).startswith(b"HTTP/1.0 431")
    finally:
        srv.close()


def test_connections_beyond_the_limit_are_closed_and_slots_come_back(registry):
    srv = start(registry)
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        time.sleep(0.2)  # every idle connection holds its slot
        assert raw_exchange(srv.port, b"GET /metrics HTTP/1.0\r\n\r\n") == b""
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + 5
        while (reply := raw_exchange(srv.port, b"GET /metrics HTTP/1.0\r\n\r\n")) == b"":
            assert time.monotonic() < deadline, "the slots did not come back"
            time.sleep(0.05)
        assert reply.startswith(b"HTTP/1.0 200")
    finally:
        for sock in idle:
            sock.close()
        srv.close()


def test_a_silent_tls_client_does_not_hold_up_others_and_slow_ones_are_cut(
    registry, pki, monkeypatch
):
    monkeypatch.setattr(metrics_http, "REQUEST_DEADLINE", 1.0)
    srv = start(registry, certfile=str(pki["server_cert"]), keyfile=str(pki["server_key"]))
    try:
        silent = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        started = time.monotonic()
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        status, _, body = get(f"https://127.0.0.1:{srv.port}/metrics", context=context)
        assert status == 200 and "probe_total 1.0" in body
        assert time.monotonic() - started < 2  # not after the silent one's timeout
        # The silent connection, still in its TLS handshake, is cut at the deadline.
        silent.settimeout(5)
        assert silent.recv(1) == b""
        assert time.monotonic() - started < 4
        silent.close()
    finally:
        srv.close()
