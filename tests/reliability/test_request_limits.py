"""Request limits and undecodable requests, on a real server.

Every request field has a bound: over it, INVALID_ARGUMENT naming the field, the limit and the
size found, and nothing is stored. A message larger than the largest legitimate request is
refused by gRPC itself (RESOURCE_EXHAUSTED). Bytes that do not decode get INVALID_ARGUMENT
and, however many arrive, a few rate-limited log lines naming the peer, never a traceback.
"""

from __future__ import annotations

import random

import grpc
import pytest

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.scenarios.request_limits import (
    FIELD_CASES,
    check_field_case,
    limited_server,
    position,
    run_receive_limit,
    run_undecodable_requests,
    send_garbage,
)
from zephon_testing.servers import ServerProcess, read_lane, write_config

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def limited(tmp_path_factory, corpus_dir):
    with limited_server(tmp_path_factory.mktemp("limits"), corpus_dir) as running:
        yield running


@pytest.mark.service
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "call", "text"), FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_a_field_over_its_limit_is_invalid_argument(limited, name, call, text):
    check_field_case(limited, name, call, text)


@pytest.mark.service
@pytest.mark.timeout(60)
def test_fields_at_their_limits_are_accepted(limited):
    for lane in range(4):
        read_lane(limited.stub, lane, 0, 2, "at-limit")
    reply = limited.stub.Checkpoint(
        pb.CheckpointRequest(positions=[position(lane, 1) for lane in range(4)], tag="t" * 256),
        timeout=20,
    )
    assert reply.checkpoint_id.startswith("ckpt-")
    assert limited.state_files()[f"{reply.checkpoint_id}.zck"] < 4096
    batches, _ = read_lane(limited.stub, 1, 0, 2, consumer="c" * 128)
    assert [b.seq for b in batches] == [0, 1]


@pytest.mark.service
@pytest.mark.timeout(60)
def test_a_message_over_the_receive_limit_is_refused_by_grpc(limited):
    run_receive_limit(limited)


# --------------------------------------------------------------------------------------------
# Undecodable requests
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.timeout(120)
def test_undecodable_requests_are_invalid_argument_and_log_a_few_lines(tmp_path, corpus_dir):
    run_undecodable_requests(tmp_path, corpus_dir)


@pytest.mark.service
@pytest.mark.timeout(60)
def test_undecodable_requests_with_auth_on(tmp_path, corpus_dir):
    cfg = write_config(tmp_path / "pipeline.yaml", corpus_dir)
    srv = ServerProcess(["--config", str(cfg)], tmp_path, env={"ZEPHON_AUTH_TOKEN": TOKEN})
    channel = grpc.insecure_channel(srv.address)
    try:
        rng = random.Random(7)
        # Without the token: UNAUTHENTICATED before anything is decoded (health is exempt).
        for method, err in send_garbage(channel, rng, 12):
            health = method.startswith("/grpc.health")
            expected = "INVALID_ARGUMENT" if health else "UNAUTHENTICATED"
            assert err.code().name == expected, (method, err.code(), err.details())
        with_token = send_garbage(channel, rng, 12, (("authorization", f"Bearer {TOKEN}"),))
        assert {e.code() for _, e in with_token} == {grpc.StatusCode.INVALID_ARGUMENT}
    finally:
        channel.close()
        assert srv.terminate() == 0
    assert "Traceback" not in srv.output()
