"""The scenarios of ``tests/service/test_metrics_http.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from zephon_testing.infra import free_port
from zephon_testing.servers import server

TOKEN = "scrape-me-7f3a"


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
