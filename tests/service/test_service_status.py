"""Every RPC error case maps to its DESIGN §5 status code with a message that says what to do."""

from __future__ import annotations

import grpc
import pytest

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.servers import open_request, server, write_config

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def running(tmp_path_factory, corpus_dir):
    work = tmp_path_factory.mktemp("status")
    cfg = write_config(work / "pipeline.yaml", corpus_dir)
    other = write_config(work / "other.yaml", corpus_dir, seed=999)
    with server(["--config", str(cfg), "--state-dir", str(work / "state")], work) as srv:
        yield srv, other, work


def stream_error(stub, *requests):
    with pytest.raises(grpc.RpcError) as info:
        for _ in stub.StreamBatches(iter(requests), timeout=20):
            pass
    return info.value


def foreign_state(other_cfg, work):
    from zephon_server.engine.config import load_config
    from zephon_server.engine.execution import ExecutionConfig

    pipeline, _ = load_config(other_cfg)
    run = pipeline.run(ExecutionConfig(runner="inline"))
    return run.checkpoint().encode()


CASES = [
    (
        "bad lane",
        lambda s, o, w: stream_error(s, open_request(99)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "lane 99 is not served",
    ),
    (
        "first message not OpenLane",
        lambda s, o, w: stream_error(s, pb.StreamBatchesRequest(ack=pb.Ack(next_seq=1))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "first StreamBatches message must be OpenLane",
    ),
    (
        "seq not yet reachable",
        lambda s, o, w: stream_error(s, open_request(0, 10_000)),
        grpc.StatusCode.OUT_OF_RANGE,
        "seq 10000 is not yet reachable; reachable range is 0..",
    ),
    (
        "unknown checkpoint id",
        lambda s, o, w: _unary(s.Resume, pb.ResumeRequest(checkpoint_id="ckpt-00000042")),
        grpc.StatusCode.NOT_FOUND,
        "unknown checkpoint id 'ckpt-00000042'",
    ),
    (
        "checkpoint from another pipeline",
        lambda s, o, w: _unary(s.Resume, pb.ResumeRequest(state=foreign_state(o, w))),
        grpc.StatusCode.FAILED_PRECONDITION,
        "seed (checkpoint 999, pipeline 1234)",
    ),
    (
        "corrupt checkpoint bytes",
        lambda s, o, w: _unary(s.Resume, pb.ResumeRequest(state=b"ZEPHONCK" + bytes(50))),
        grpc.StatusCode.DATA_LOSS,
        "checksum mismatch",
    ),
    (
        "empty resume request",
        lambda s, o, w: _unary(s.Resume, pb.ResumeRequest()),
        grpc.StatusCode.INVALID_ARGUMENT,
        "needs checkpoint_id or state",
    ),
    (
        "checkpoint of a lane not served",
        lambda s, o, w: _unary(
            s.Checkpoint, pb.CheckpointRequest(positions=[pb.LanePosition(lane=77, next_seq=0)])
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "lane 77 is not served",
    ),
    (
        "checkpoint beyond what was produced",
        lambda s, o, w: _unary(
            s.Checkpoint,
            pb.CheckpointRequest(positions=[pb.LanePosition(lane=0, next_seq=1_000_000)]),
        ),
        grpc.StatusCode.OUT_OF_RANGE,
        "this server restarted behind the trainer",  # not produced yet: both causes named
    ),
]


def _unary(method, request):
    with pytest.raises(grpc.RpcError) as info:
        method(request, timeout=20)
    return info.value


@pytest.mark.parametrize(("name", "call", "code", "text"), CASES, ids=[c[0] for c in CASES])
def test_status_codes(running, name, call, code, text):
    srv, other, work = running
    err = call(srv.stub(), other, work)
    assert err.code() == code, (name, err.code(), err.details())
    assert text in err.details()
    assert "Traceback" not in err.details()
    # The server stays healthy after every bad request.
    info = srv.stub().GetInfo(pb.GetInfoRequest(), timeout=10)
    assert info.num_lanes == 4


def test_health_and_reflection_answer(running):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    srv, _, _ = running
    channel = grpc.insecure_channel(srv.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "zephon.v1.DataService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "zephon.v1.DataService" in services and "grpc.health.v1.Health" in services
    method = ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol(
        "zephon.v1.DataService"
    )
    assert method.package == "zephon.v1"
