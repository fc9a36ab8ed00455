"""Security: TLS and mutual TLS (certificates generated at test time) and the bearer-token
interceptor (``--auth-token`` or ``ZEPHON_AUTH_TOKEN``; health exempt).

A plaintext or untrusted client fails the handshake (UNAVAILABLE, nothing served); a missing
or wrong token gets UNAUTHENTICATED on every DataService RPC; health checks answer without a
token. The scenario function returns its figures for ``tools/reliability_report.py``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from zephon_client import DataClient, TLSConfig
from zephon_client.connect_hint import diagnose, probe_tls
from zephon_client.errors import ZephonClientError
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_testing.scenarios.security import (
    EXPECTED,
    TOKEN,
    make_pki,
    run_security_matrix,
    tls_server,
    trusted,
)
from zephon_testing.servers import ServerProcess, write_config

pytestmark = pytest.mark.service


# --------------------------------------------------------------------------------------------
# Certificates (cryptography, generated per test session)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("cryptography")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def config(tmp_path_factory, corpus_dir) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("security")
    return write_config(work / "pipeline.yaml", corpus_dir), work


# --------------------------------------------------------------------------------------------
# Probes
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_tls_mtls_and_token_matrix(config, pki):
    cfg, work = config
    results = run_security_matrix(cfg, work, pki)
    assert results == EXPECTED


@pytest.mark.timeout(60)
def test_every_rpc_needs_the_token_and_the_message_says_how(config, monkeypatch):
    cfg, work = config
    srv = ServerProcess(["--config", str(cfg)], work, env={"ZEPHON_AUTH_TOKEN": TOKEN})
    channel = grpc.insecure_channel(srv.address)
    stub = pb_grpc.DataServiceStub(channel)
    calls: dict[str, Any] = {
        "GetInfo": lambda md: stub.GetInfo(pb.GetInfoRequest(), timeout=5, metadata=md),
        "Checkpoint": lambda md: stub.Checkpoint(pb.CheckpointRequest(), timeout=5, metadata=md),
        "Resume": lambda md: stub.Resume(
            pb.ResumeRequest(checkpoint_id="ckpt-00000001"), timeout=5, metadata=md
        ),
        "StreamBatches": lambda md: next(
            iter(
                stub.StreamBatches(
                    iter([pb.StreamBatchesRequest(open=pb.OpenLane(lane=0))]),
                    timeout=5,
                    metadata=md,
                )
            )
        ),
    }
    try:
        for name, call in calls.items():
            for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)):
                with pytest.raises(grpc.RpcError) as info:
                    call(metadata)
                err = info.value
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (name, err.code())
                details = err.details()
                assert "authorization: Bearer <token>" in details and TOKEN not in details
        # The client library sends the token from its argument or the environment.
        with DataClient(srv.address, auth_token=TOKEN, reconnect_timeout=5) as client:
            assert next(iter(client)).seq == 0
        with pytest.raises(ZephonClientError) as info:
            DataClient(srv.address, auth_token="nope", reconnect_timeout=5)
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        monkeypatch.setenv("ZEPHON_AUTH_TOKEN", TOKEN)
        with DataClient(srv.address, reconnect_timeout=5) as client:
            assert next(iter(client)).seq == 0
    finally:
        channel.close()
        assert srv.terminate() == 0


# --------------------------------------------------------------------------------------------
# A connection that cannot work is named at once, with its fix
# --------------------------------------------------------------------------------------------


def _client_error(address: str, tls: TLSConfig | None) -> ZephonClientError:
    with pytest.raises(ZephonClientError) as info:
        DataClient(address, tls=tls, reconnect_timeout=60)
    return info.value


@pytest.mark.timeout(120)
def test_a_tls_mismatch_fails_at_once_naming_the_fix(config, pki):
    cfg, work = config
    rogue = TLSConfig(root_certificates=pki["rogue_ca"])
    wrong_name = TLSConfig(root_certificates=pki["ca"], server_name_override="elsewhere.example")
    rogue_cert = TLSConfig(
        root_certificates=pki["ca"],
        certificate_chain=pki["rogue_client_cert"],
        private_key=pki["rogue_client_key"],
    )
    srv = tls_server(cfg, work, pki, mutual=True)
    try:
        # A client whose certificate the server accepts is never told otherwise: a reset or
        # closed connection of a blip stays a retried UNAVAILABLE.
        assert diagnose(srv.address, trusted(pki, cert=True), "Socket closed") is None
        # Each would otherwise be retried for the whole reconnect_timeout (60 s here; the
        # test's timeout is shorter than their sum).
        cases = {
            "plaintext": (None, "speaks TLS and this client connects in plaintext"),
            "no certificate": (trusted(pki), "requires a client certificate"),
            "untrusted CA": (rogue, "not signed by a CA this client trusts"),
            "wrong name": (wrong_name, "not issued for the name"),
            "untrusted client certificate": (rogue_cert, "does not accept this client's"),
        }
        for name, (tls, hint) in cases.items():
            err = _client_error(srv.address, tls)
            assert err.code == grpc.StatusCode.UNAVAILABLE, name
            assert hint in err.message and "not retried" in err.message, (name, err.message)
        with DataClient(srv.address, tls=trusted(pki, cert=True), reconnect_timeout=5) as client:
            assert next(iter(client)).seq == 0
    finally:
        assert srv.terminate() == 0
    srv = ServerProcess(["--config", str(cfg)], work)
    try:
        err = _client_error(srv.address, trusted(pki))
        assert "does not speak TLS" in err.message and "not retried" in err.message, err.message
    finally:
        assert srv.terminate() == 0


@pytest.mark.timeout(120)
def test_zephon_tail_reaches_a_tls_server_and_names_a_missing_flag(config, pki):
    cfg, work = config
    srv = tls_server(cfg, work, pki, mutual=True)
    try:
        base = [sys.executable, "-m", "zephon_server.cli", "tail", "--address", srv.address]
        base += ["--lane", "0", "--count", "1", "--no-decode"]
        bare = subprocess.run(base, capture_output=True, text=True, timeout=60)
        assert bare.returncode == 2 and "--tls-ca" in bare.stderr, bare.stderr
        ca_only = subprocess.run(
            [*base, "--tls-ca", str(pki["ca"])], capture_output=True, text=True, timeout=60
        )
        assert ca_only.returncode == 2 and "--tls-cert, --tls-key" in ca_only.stderr
        mtls = [*base, "--tls-ca", str(pki["ca"]), "--tls-cert", str(pki["client_cert"])]
        mtls += ["--tls-key", str(pki["client_key"])]
        done = subprocess.run(mtls, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("lane 0 seq 0"), done.stderr
    finally:
        assert srv.terminate() == 0


def _serve_once(reply: bytes) -> tuple[str, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"

    def answer() -> None:
        with listener, listener.accept()[0] as conn:
            conn.recv(4096)
            conn.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return address, thread


def test_the_probe_tells_a_plaintext_server_and_an_unreachable_one():
    address, thread = _serve_once(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" * 4)  # HTTP/2 bytes
    assert probe_tls(address, timeout=5) == "plaintext"
    thread.join(5)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        closed = f"127.0.0.1:{taken.getsockname()[1]}"
    assert probe_tls(closed, timeout=5) is None
    # A closed connection at a plaintext server is not blamed on TLS.
    address, thread = _serve_once(b"")
    assert diagnose(address, None, "Socket closed") is None
    thread.join(5)
