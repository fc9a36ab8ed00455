"""The scenarios of ``tests/reliability/test_request_limits.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_server.service.limits import RequestLimits
from zephon_testing.scenarios.faults import health_status
from zephon_testing.servers import ServerProcess, open_request, read_lane, write_config


class Limited:
    """A running server with a state directory, a channel and a stub."""

    def __init__(self, srv: ServerProcess, state_dir: Path) -> None:
        self.srv = srv
        self.state_dir = state_dir
        self.channel = grpc.insecure_channel(srv.address)
        self.stub = pb_grpc.DataServiceStub(self.channel)

    def state_files(self) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in self.state_dir.glob("*.zck")}


@contextlib.contextmanager
def limited_server(work: Path, corpus_dir: Path) -> Iterator[Limited]:
    """A server over the corpus with a state directory for the block; checks it exits 0."""
    cfg = write_config(work / "pipeline.yaml", corpus_dir)
    state_dir = work / "state"
    srv = ServerProcess(["--config", str(cfg), "--state-dir", str(state_dir)], work)
    running = Limited(srv, state_dir)
    try:
        yield running
    finally:
        running.channel.close()
        assert srv.terminate() == 0, srv.output()[-3000:]


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def checkpoint(limited: Limited, **fields):
    return lambda: limited.stub.Checkpoint(pb.CheckpointRequest(**fields), timeout=20)


def stream(limited: Limited, *requests):
    def call():
        for n, _ in enumerate(limited.stub.StreamBatches(iter(requests), timeout=20)):
            if n >= 50:
                break

    return call


def position(lane: int, seq: int = 0) -> pb.LanePosition:
    return pb.LanePosition(lane=lane, next_seq=seq)


# (name, call(limited) -> callable, text in the details)
FIELD_CASES = [
    (
        "Checkpoint tag over 256 bytes of UTF-8",
        lambda r: checkpoint(r, tag="é" * 129),
        "CheckpointRequest.tag is 258 bytes of UTF-8; the limit is 256: use a shorter tag",
    ),
    (
        "Checkpoint with more positions than lanes",
        lambda r: checkpoint(r, positions=[position(lane % 4) for lane in range(5)]),
        "CheckpointRequest.positions has 5 entries; the limit is one per lane this server "
        "serves (4: lanes [0, 1, 2, 3])",
    ),
    (
        "Checkpoint listing a lane twice",
        lambda r: checkpoint(r, positions=[position(1), position(2), position(1)]),
        "CheckpointRequest.positions[2].lane is 1, listed twice",
    ),
    (
        "Checkpoint of a lane not served",
        lambda r: checkpoint(r, positions=[position(0), position(9)]),
        "CheckpointRequest.positions[1].lane: lane 9 is not served here; this server serves lanes "
        "[0, 1, 2, 3] of 4",
    ),
    (
        "Resume by an id over 128 bytes",
        lambda r: lambda: r.stub.Resume(pb.ResumeRequest(checkpoint_id="c" * 129), timeout=20),
        "ResumeRequest.checkpoint_id is 129 bytes; the limit is 128",
    ),
    (
        "Resume from state bytes over the limit",
        lambda r: (
            lambda: r.stub.Resume(
                pb.ResumeRequest(
                    state=b"\0" * (RequestLimits(4, (0, 1, 2, 3), 3).state_max_bytes + 1)
                ),
                timeout=20,
            )
        ),
        "ResumeRequest.state is 1055745 bytes; the limit is 1055744 bytes for 4 lanes and 3 "
        "datasets",
    ),
    (
        "OpenLane consumer over 128 bytes",
        lambda r: stream(r, open_request(0, consumer="r" * 129)),
        "OpenLane.consumer is 129 bytes of UTF-8; the limit is 128",
    ),
    (
        "OpenLane consumer with a newline",
        lambda r: stream(r, open_request(0, consumer="rank3\nFAKE LOG LINE")),
        "OpenLane.consumer has a control character (U+000A) at position 5",
    ),
    (
        "GetInfo consumer over 128 bytes",
        lambda r: lambda: r.stub.GetInfo(pb.GetInfoRequest(consumer="r" * 129), timeout=20),
        "GetInfoRequest.consumer is 129 bytes of UTF-8; the limit is 128",
    ),
    (
        "GetInfo consumer with a newline",
        lambda r: lambda: r.stub.GetInfo(pb.GetInfoRequest(consumer="rank3\nFAKE"), timeout=20),
        "GetInfoRequest.consumer has a control character (U+000A) at position 5",
    ),
    (
        "RingReply reason over 512 bytes",
        lambda r: stream(
            r,
            open_request(0, consumer="ring-reason"),
            pb.StreamBatchesRequest(ring=pb.RingReply(accepted=False, reason="x" * 513)),
        ),
        "RingReply.reason is 513 bytes of UTF-8; the limit is 512",
    ),
]


def check_field_case(limited: Limited, name: str, call, text: str) -> tuple[str, str]:
    """One of ``FIELD_CASES``: checks INVALID_ARGUMENT with ``text`` and nothing stored;
    returns (code, details)."""
    before = limited.state_files()
    err = rpc_error(call(limited))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, err.code(), err.details())
    assert text in err.details(), (name, err.details())
    assert limited.state_files() == before  # nothing was stored
    return err.code().name, err.details()


def run_receive_limit(limited: Limited) -> dict[str, tuple[str, str]]:
    """A 50 MiB Checkpoint tag and 4 MiB of Resume state: checks gRPC refuses both
    (RESOURCE_EXHAUSTED), nothing is stored, the server serves on; returns (code, details)."""
    before = limited.state_files()
    out = {}
    # The report's case: a 50 MiB tag used to be a 52 MB checkpoint file.
    err = rpc_error(checkpoint(limited, tag="T" * (50 << 20)))
    out["Checkpoint with a 50 MiB tag"] = (err.code().name, err.details())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.code(), err.details())
    # Just over the 4 MiB the server accepts with 4 lanes and 3 datasets.
    err = rpc_error(
        lambda: limited.stub.Resume(pb.ResumeRequest(state=b"\0" * (4 << 20)), timeout=20)
    )
    out["Resume with 4 MiB of state"] = (err.code().name, err.details())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.code(), err.details())
    assert limited.state_files() == before
    assert health_status(limited.srv.address) == "SERVING"
    assert limited.stub.GetInfo(pb.GetInfoRequest(), timeout=10).num_lanes == 4
    assert "Traceback" not in limited.srv.output()
    return out


UNARY = {
    "/zephon.v1.DataService/GetInfo": pb.GetInfoRequest,
    "/zephon.v1.DataService/Checkpoint": pb.CheckpointRequest,
    "/zephon.v1.DataService/Resume": pb.ResumeRequest,
    "/grpc.health.v1.Health/Check": health_pb2.HealthCheckRequest,
}


STREAM = "/zephon.v1.DataService/StreamBatches"


def garbage(rng: random.Random, message_type) -> bytes:
    """Random bytes that do not decode as ``message_type``."""
    while True:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        try:
            message_type.FromString(data)
        except Exception:
            return data


def send_garbage(channel: grpc.Channel, rng: random.Random, n: int, metadata=()) -> list:
    """``n`` undecodable requests over every method; (method, RpcError) of each."""
    identity = {"request_serializer": None, "response_deserializer": None}
    errors = []
    methods = [*UNARY, STREAM, STREAM + " after OpenLane"]
    for i in range(n):
        method = methods[i % len(methods)]
        if method in UNARY:
            unary = channel.unary_unary(method, **identity)
            data = garbage(rng, UNARY[method])
            error = rpc_error(lambda u=unary, d=data: u(d, timeout=10, metadata=metadata))
            errors.append((method, error))
            continue
        bad = garbage(rng, pb.StreamBatchesRequest)
        first = [bad] if method == STREAM else [open_request(i % 4).SerializeToString(), bad]
        call = channel.stream_stream(STREAM, **identity)

        def read(call=call, first=first):
            for _ in call(iter(first), timeout=10, metadata=metadata):
                pass

        errors.append((method, rpc_error(read)))
    return errors


def run_undecodable_requests(tmp_path: Path, corpus_dir: Path, n: int = 200) -> dict:
    """``n`` undecodable requests over every method: checks each is INVALID_ARGUMENT, the
    server serves on, and its log has a few rate-limited lines and no traceback; returns the
    counts, the seconds they took and one such line."""
    cfg = write_config(tmp_path / "pipeline.yaml", corpus_dir)
    srv = ServerProcess(["--config", str(cfg), "--state-dir", str(tmp_path / "state")], tmp_path)
    channel = grpc.insecure_channel(srv.address)
    try:
        start = time.monotonic()
        errors = send_garbage(channel, random.Random(19), n)
        elapsed = time.monotonic() - start
        for _, err in errors:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
            assert "does not decode as" in err.details(), err.details()
        assert health_status(srv.address) == "SERVING"
        stub = pb_grpc.DataServiceStub(channel)
        batches, _ = read_lane(stub, 0, 0, 3, "after-garbage")
        assert [b.seq for b in batches] == [0, 1, 2]
    finally:
        channel.close()
        assert srv.terminate() == 0
    log = srv.output()
    assert "Traceback" not in log and "Exception deserializing" not in log
    lines = [line for line in log.splitlines() if "malformed request" in line]
    # One line per method (five of them) per 10 s, each naming the peer and the problem.
    assert 5 <= len(lines) <= 5 * (1 + int(elapsed // 10)), lines
    assert all("from ipv" in line and "do not decode as" in line for line in lines), lines
    return {
        "requests": len(errors),
        "codes": Counter(err.code().name for _, err in errors),
        "log_lines": len(lines),
        "tracebacks": log.count("Traceback"),
        "elapsed_s": elapsed,
        "line": lines[0],
    }
