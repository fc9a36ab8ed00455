"""``/metrics`` security: loopback by default, bearer/basic auth, TLS and mutual TLS, bounds.

The first tests start real ``zephon serve`` subprocesses and read ``/metrics`` with urllib
(what curl or Prometheus would do); the last ones serve an injected registry in-process to
check the bounds on connections, request heads and slow clients, and the flag checks.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.reliability.test_security import make_pki
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
from zephon_testing.infra import free_port
from zephon_testing.servers import serve_once, server

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

TOKEN = "scrape-me-7f3a"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("metrics-pki"))


def get(url: str, *, headers=None, context: ssl.SSLContext | None = None):
    """(status, headers, body) of a GET; HTTP errors are answers too."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, reply.headers, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read().decode()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def listening(port: int) -> set[str]:
    """The addresses a TCP socket of this machine listens on at ``port`` (/proc/net/tcp*)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)
            if width == 8:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


# --------------------------------------------------------------------------------------------
# real servers
# --------------------------------------------------------------------------------------------


def run_metrics_on_loopback_by_default(tmp_path: Path) -> dict[str, str]:
    """``--host 0.0.0.0`` without ``--metrics-host``: checks /metrics listens on loopback
    only and answers there; returns the addresses and the answer."""
    port = free_port()
    args = ["--host", "0.0.0.0", "--auth-token", "grpc-secret", "--metrics-port", str(port)]
    with server(args, tmp_path) as srv:
        assert listening(port) == {"127.0.0.1"}
        assert listening(srv.port) & {"0.0.0.0", "::"}  # what --host 0.0.0.0 looks like
        status, _, body = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "zephon_batches_sent_total" in body
        assert f"metrics on http://127.0.0.1:{port}/metrics (no authentication)" in srv.output()
        assert "needs no credentials while gRPC does" not in srv.output()
        return {
            "gRPC listens on": ", ".join(sorted(listening(srv.port))),
            "/metrics listens on": ", ".join(sorted(listening(port))),
            "GET /metrics on 127.0.0.1": str(status),
        }


def test_metrics_listen_on_loopback_by_default_even_with_host_0_0_0_0(tmp_path):
    run_metrics_on_loopback_by_default(tmp_path)


def run_metrics_on_all_interfaces(tmp_path: Path) -> dict[str, str]:
    """``--metrics-host 0.0.0.0`` without credentials while gRPC has a token: checks the
    server says so at start-up; returns the addresses and the warning."""
    port = free_port()
    args = ["--host", "0.0.0.0", "--metrics-host", "0.0.0.0", "--metrics-port", str(port)]
    with server([*args, "--auth-token", "grpc-secret"], tmp_path) as srv:
        assert listening(port) == {"0.0.0.0"}
        assert "/metrics on 0.0.0.0 needs no credentials while gRPC does" in srv.output()
        warning = next(line for line in srv.output().splitlines() if "needs no cred" in line)
        return {"/metrics listens on": ", ".join(sorted(listening(port))), "warning": warning}


def test_metrics_on_all_interfaces_without_credentials_are_warned_about(tmp_path):
    run_metrics_on_all_interfaces(tmp_path)


def run_metrics_auth(tmp_path: Path) -> dict[str, list[int]]:
    """A bearer token (environment) and a basic-auth file: checks 7 wrong or missing
    credentials get 401 with both challenges and no metrics, and the 3 right ones 200;
    returns the statuses of each group."""
    users = tmp_path / "metrics-users"
    users.write_text("# scrapers\nprometheus:s3cret-pw\n\ngrafana:other:pw-with-colon\n")
    users.chmod(0o600)
    port = free_port()
    args = ["--metrics-port", str(port), "--metrics-basic-auth-file", str(users)]
    statuses: dict[str, list[int]] = {"refused": [], "accepted": []}
    with server(args, tmp_path, env={"ZEPHON_METRICS_TOKEN": TOKEN}) as srv:
        url = f"http://127.0.0.1:{port}/metrics"
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": TOKEN},
            basic("prometheus", "wrong"),
            basic("nobody", "s3cret-pw"),
            {"Authorization": "Basic not-base64!"},
        ):
            status, reply_headers, body = get(url, headers=headers)
            statuses["refused"].append(status)
            assert status == 401, headers
            assert reply_headers.get_all("WWW-Authenticate") == [
                'Bearer realm="zephon-metrics"',
                'Basic realm="zephon-metrics"',
            ]
            assert "zephon_" not in body
            assert body.startswith("401 Unauthorized: /metrics needs 'Authorization: Bearer")
        for headers in (
            {"Authorization": f"Bearer {TOKEN}"},
            basic("prometheus", "s3cret-pw"),
            basic("grafana", "other:pw-with-colon"),
        ):
            status, reply_headers, body = get(url, headers=headers)
            statuses["accepted"].append(status)
            assert status == 200, headers
            assert "zephon_batches_sent_total" in body
            assert "CPython" not in reply_headers.get("Server", "")
        assert "(needs a bearer token or basic auth)" in srv.output()
        assert TOKEN not in srv.output()
    return statuses


def test_metrics_need_the_token_or_a_basic_auth_user(tmp_path):
    run_metrics_auth(tmp_path)


def run_metrics_tls(tmp_path: Path, pki: dict[str, Path], mutual: bool) -> dict[str, str]:
    """/metrics with the gRPC certificate (and client certificates when ``mutual``): checks
    a trusted client gets 200, an untrusted server certificate, plain HTTP, and without or
    with a rogue client certificate get no answer; returns each outcome."""
    out: dict[str, str] = {}
    port = free_port()
    args = ["--metrics-port", str(port)]
    args += ["--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"])]
    if mutual:
        args += ["--tls-client-ca", str(pki["ca"])]
    trusted = ssl.create_default_context(cafile=str(pki["ca"]))
    with server(args, tmp_path) as srv:
        url = f"https://127.0.0.1:{port}/metrics"
        if mutual:
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)) as info:
                get(url, context=trusted)  # no client certificate
            out["no client certificate"] = type(info.value).__name__
            rogue = ssl.create_default_context(cafile=str(pki["ca"]))
            rogue.load_cert_chain(pki["rogue_client_cert"], pki["rogue_client_key"])
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)) as info:
                get(url, context=rogue)
            out["client certificate of another CA"] = type(info.value).__name__
            trusted.load_cert_chain(pki["client_cert"], pki["client_key"])
        status, _, body = get(url, context=trusted)
        out["trusted client" + (" with its certificate" if mutual else "")] = str(status)
        assert status == 200 and "zephon_batches_sent_total" in body
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED") as info:
            get(url, context=ssl.create_default_context())  # the system roots do not sign it
        reason = info.value.reason
        out["client trusting only the system roots"] = getattr(reason, "reason", str(reason))
        with pytest.raises(
            (http.client.HTTPException, ConnectionError, urllib.error.URLError)
        ) as info:
            get(f"http://127.0.0.1:{port}/metrics")  # plain HTTP gets no answer
        out["plain HTTP"] = type(info.value).__name__
        needs = "needs a client certificate" if mutual else "no authentication"
        assert f"metrics on https://127.0.0.1:{port}/metrics ({needs})" in srv.output()
    return out


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
