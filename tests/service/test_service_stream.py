"""Streaming over loopback gRPC from a real server process: equality with ``zephon dump``,
shared lanes, reconnects, checkpoint → restart with ``--resume latest``, SIGTERM drain."""

from __future__ import annotations

import contextlib
import time

import grpc
import pytest

from zephon_client.wire import CHAIN_SEED, decode_batch, verify
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.servers import read_lane, serve_once, server

pytestmark = pytest.mark.service


@pytest.fixture
def config(stream_config):
    return stream_config


@pytest.fixture
def expected(stream_expected):
    return stream_expected


def chains(batches):
    prev = CHAIN_SEED
    for msg in batches:
        b = decode_batch(msg)
        verify(b, prev)
        prev = b.chain_digest
    return [m.chain_digest.hex() for m in batches]


def test_lanes_equal_dump_and_end_with_end_of_stream(config, expected):
    cfg, work = config
    with server(["--config", str(cfg)], work) as srv:
        stub = srv.stub()
        for lane in range(4):
            batches, end = read_lane(stub, lane)
            assert chains(batches) == expected[lane]
            assert end is not None and end.next_seq == len(expected[lane])
            assert end.chain_digest.hex() == expected[lane][-1]


def test_two_consumers_of_one_lane_get_identical_batches(config, expected):
    import concurrent.futures as cf

    cfg, work = config
    with server(["--config", str(cfg)], work) as srv, cf.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(read_lane, srv.stub(), 2, 0, None, f"peer{i}") for i in range(2)]
        (a, _), (b, _) = (f.result(timeout=120) for f in futures)
    assert [m.SerializeToString() for m in a] == [m.SerializeToString() for m in b]
    assert chains(a) == expected[2]


@pytest.mark.parametrize("runner", ["inline", "threads", "processes"])
def test_batch_groups_carry_the_same_batches(config, expected, runner):
    """A client that takes several batches per message gets the ready ones grouped: the same
    batches in the same order as one per message (the dump), on every runner."""
    cfg, work = config
    workers = "1" if runner == "inline" else "2"
    args = ["--config", str(cfg), "--runner", runner, "--workers", workers]
    with server(args, work) as srv:
        stub = srv.stub()
        time.sleep(1.0)  # let the hub run ahead, so batches are ready together
        for lane in range(4):
            sizes: list[int] = []
            batches, end = read_lane(stub, lane, per_message=4, sizes=sizes)
            assert chains(batches) == expected[lane]
            assert end is not None and end.next_seq == len(expected[lane])
            assert max(sizes) <= 4 and sum(sizes) == len(batches)
            assert max(sizes) > 1, sizes  # some did travel together


def test_batch_groups_respect_the_send_window(config):
    """Without acks a stream stops at the server's window (16 batches), groups or not."""
    import threading

    from zephon_server.service.servicer import WINDOW

    cfg, work = config
    with server(["--config", str(cfg)], work) as srv:
        time.sleep(1.0)
        sizes: list[int] = []

        def read() -> None:
            with contextlib.suppress(grpc.RpcError):  # the server drains at the end
                read_lane(srv.stub(), 0, count=WINDOW + 1, ack=False, per_message=8, sizes=sizes)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while sum(sizes) < WINDOW and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # nothing more may come without an ack
        assert sum(sizes) == WINDOW, sizes
        assert max(sizes) <= 8 and len(sizes) >= WINDOW // 8


def test_streams_linger_to_fill_their_groups(config, expected):
    """With --linger-ms a stream waits after its first message until as many batches as the
    client takes exist: every message between the first and the last is full (the default
    pipeline here makes batches faster than 4 per second), and the batches are the dump's."""
    cfg, work = config
    with server(["--config", str(cfg), "--linger-ms", "1000"], work) as srv:
        for lane in (0, 3):
            sizes: list[int] = []
            batches, end = read_lane(srv.stub(), lane, per_message=4, sizes=sizes)
            assert chains(batches) == expected[lane]
            assert end is not None and end.next_seq == len(expected[lane])
            assert len(sizes) > 3 and set(sizes[1:-1]) == {4}, sizes


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--linger-ms", "-1"),
        ("--linger-ms", "5000"),
        ("--linger-ms", "soon"),
        ("--shm-ring-mib", "-1"),
        ("--shm-ring-mib", "5000"),
        ("--shm-ring-mib", "lots"),
    ],
)
def test_a_bad_stream_flag_fails_at_start_up(config, flag, value):
    cfg, work = config
    res = serve_once(["--config", str(cfg), flag, value], work)
    assert res.returncode == 2, res.stderr[-2000:]
    assert flag in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]


def test_reconnect_mid_lane_continues_exactly(config, expected):
    cfg, work = config
    with server(["--config", str(cfg)], work) as srv:
        first, _ = read_lane(srv.stub(), 1, 0, count=5)
        rest, _ = read_lane(srv.stub(), 1, 5)
    assert chains(first + rest) == expected[1]


def test_old_seq_is_regenerated_by_replay(config, expected):
    cfg, work = config
    with server(["--config", str(cfg), "--max-ahead", "2"], work) as srv:
        stub = srv.stub()
        read_lane(stub, 0)  # consume the whole lane: early batches are evicted
        again, _ = read_lane(stub, 0, 1)
    assert [m.chain_digest.hex() for m in again] == expected[0][1:]


def test_checkpoint_restart_with_resume_latest_is_bit_identical(config, expected, tmp_path):
    cfg, _ = config
    state = tmp_path / "state"
    with server(["--config", str(cfg), "--state-dir", str(state)], tmp_path) as srv:
        stub = srv.stub()
        consumed = {lane: read_lane(stub, lane, 0, count=3)[0] for lane in range(4)}
        resp = stub.Checkpoint(
            pb.CheckpointRequest(
                positions=[pb.LanePosition(lane=lane, next_seq=3) for lane in range(4)], tag="step3"
            ),
            timeout=30,
        )
        assert resp.checkpoint_id.endswith("step3") and len(resp.state) < 1024 * 4
    # A new server process resumes from the persisted checkpoint.
    with server(
        [
            "--config",
            str(cfg),
            "--state-dir",
            str(state),
            "--resume",
            "latest",
            "--runner",
            "processes",
        ],
        tmp_path,
    ) as srv:
        stub = srv.stub()
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=10)
        assert resp.checkpoint_id in info.checkpoint_ids
        assert {p.lane: p.next_seq for p in info.acknowledged} == dict.fromkeys(range(4), 3)
        for lane in range(4):
            rest, _end = read_lane(stub, lane, 3)
            assert chains(consumed[lane] + rest) == expected[lane]
            with pytest.raises(grpc.RpcError) as err:
                read_lane(stub, lane, 2)  # before the resume point: gone
            assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE


def test_sigterm_drains_streams_and_exits_zero(config, tmp_path):
    cfg, _ = config
    from zephon_testing.servers import ServerProcess

    srv = ServerProcess(["--config", str(cfg), "--drain-grace", "5"], tmp_path)
    stub = srv.stub()
    import threading

    errors = []

    def slow_reader():
        try:
            read_lane(stub, 0, 0, count=None, ack=False)  # stalls at the window
        except grpc.RpcError as exc:
            errors.append(exc)

    t = threading.Thread(target=slow_reader)
    t.start()
    time.sleep(1.0)
    start = time.monotonic()
    code = srv.terminate(timeout=30)
    t.join(10)
    assert code == 0
    assert time.monotonic() - start < 15
    assert errors and errors[0].code() == grpc.StatusCode.UNAVAILABLE
    assert "draining" in srv.output()
