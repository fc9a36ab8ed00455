"""``/metrics`` security: loopback by default, bearer/basic auth, TLS and mutual TLS, bounds.

The first tests start real ``zephon serve`` subprocesses and read ``/metrics`` with urllib
(what curl or Prometheus would do); the last ones serve an injected registry in-process to
check the bounds on connections, request heads and slow clients, and the flag checks.
"""

from __future__ import annotations

import argparse
import base64
import socket
import ssl
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from zephon_server.engine.errors import ZephonError
from zephon_server.service import metrics_http
from zephon_server.service.metrics_http import (
    MAX_CONNECTIONS,
    MAX_REQUEST_HEAD,
    Authenticator,
    MetricsHTTPConfig,
    MetricsHTTPServer,
    config_from_args,
)
from zephon_testing.scenarios.metrics_http import (
    TOKEN,
    basic,
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


def test_the_authenticator_compares_every_credential():
    auth = Authenticator("tok", [("a", "1"), ("b", "2:3")])
    assert auth.allows("Bearer tok") and auth.allows("bearer  tok ")
    assert auth.allows(basic("a", "1")["Authorization"])
    assert auth.allows(basic("b", "2:3")["Authorization"])
    for header in (None, "", "Bearer", "Bearer to", "Basic", "Basic ???", "tok", "Digest tok"):
        assert not auth.allows(header), header
    assert not auth.allows(basic("a", "2:3")["Authorization"])
    assert not auth.allows("Basic " + base64.b64encode(b"a1").decode())
    assert Authenticator(None, []).allows(None)
    assert not Authenticator(None, [("a", "1")]).allows("Bearer tok")


def namespace(**kwargs) -> argparse.Namespace:
    base = dict(
        metrics_port=9400,
        metrics_host="127.0.0.1",
        metrics_tls="auto",
        metrics_auth_token=None,
        metrics_basic_auth_file=None,
        tls_cert=None,
        tls_key=None,
        tls_client_ca=None,
    )
    return argparse.Namespace(**{**base, **kwargs})


def test_config_from_flags_and_environment(tmp_path):
    assert config_from_args(namespace(metrics_port=None), {}) is None
    plain = config_from_args(namespace(), {})
    assert plain is not None and not plain.tls and plain.schemes == [] and plain.loopback
    env = config_from_args(namespace(), {"ZEPHON_METRICS_TOKEN": "env-secret"})
    assert env is not None and env.token == "env-secret" and "env-secret" not in repr(env)
    flag = config_from_args(namespace(metrics_auth_token="f"), {"ZEPHON_METRICS_TOKEN": "e"})
    assert flag is not None and flag.token == "f"
    tls = namespace(tls_cert="c.pem", tls_key="k.pem", tls_client_ca="ca.pem")
    auto = config_from_args(tls, {})
    assert auto is not None and auto.tls and auto.client_cafile == "ca.pem"
    off = config_from_args(namespace(**{**vars(tls), "metrics_tls": "off"}), {})
    assert off is not None and not off.tls and off.client_cafile is None
    wide = config_from_args(namespace(metrics_host="0.0.0.0"), {})
    assert wide is not None and not wide.loopback
    with pytest.raises(ZephonError, match="--metrics-tls on needs --tls-cert and --tls-key"):
        config_from_args(namespace(metrics_tls="on"), {})
    with pytest.raises(ZephonError, match="--metrics-host needs --metrics-port"):
        config_from_args(namespace(metrics_port=None, metrics_host="0.0.0.0"), {})
    empty = tmp_path / "empty"
    empty.write_text("# nobody\n")
    with pytest.raises(ZephonError, match="no 'user:password' line"):
        config_from_args(namespace(metrics_basic_auth_file=str(empty)), {})
    twice = tmp_path / "twice"
    twice.write_text("a:1\na:2\n")
    with pytest.raises(ZephonError, match="line 2: user 'a' appears twice"):
        config_from_args(namespace(metrics_basic_auth_file=str(twice)), {})
    with pytest.raises(ZephonError, match="cannot read it"):
        config_from_args(namespace(metrics_basic_auth_file=str(tmp_path / "missing")), {})
    with pytest.raises(ValueError, match="port must be between 0 and 65535, got 70000"):
        MetricsHTTPConfig(host="127.0.0.1", port=70000)
