"""Security: TLS and mutual TLS (certificates generated at test time) and the bearer-token
interceptor (``--auth-token`` or ``ZEPHON_AUTH_TOKEN``; health exempt).

A plaintext or untrusted client fails the handshake (UNAVAILABLE, nothing served); a missing
or wrong token gets UNAUTHENTICATED on every DataService RPC; health checks answer without a
token. The scenario function returns its figures for ``tools/reliability_report.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from zephon_client import DataClient
from zephon_client.errors import ZephonClientError
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_testing.scenarios.security import EXPECTED, TOKEN, make_pki, run_security_matrix
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
