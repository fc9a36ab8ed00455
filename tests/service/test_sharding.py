"""Lane-sharded servers: ``zephon serve --lanes`` shards of one pipeline behave as one server.

Two shards of four lanes stream, per lane, exactly what one server of eight lanes streams (as
``zephon dump`` prints it); the client routes lanes by ``GetInfo.served_lanes``. Checkpoints
taken on the shards combine per lane and resume exactly on a different number of shards.
"""

from __future__ import annotations

import grpc
import pytest

from zephon_client import DataClient, ZephonClientError
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.checkpoint import ResumeState, read_state_file, write_atomic
from zephon_testing.servers import dump_digests, read_lane, server, write_config

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus_dir):
    work = tmp_path_factory.mktemp("sharding")
    # Lane-sharded servers cannot know the other shards' lane ends: end_of_data shortest is
    # refused for them on finite data (test_lane_ends_service.py), so each lane runs to its end.
    cfg = write_config(
        work / "pipeline.yaml", corpus_dir, lanes=8, chunk_size=8, end_of_data="longest"
    )
    return cfg, work, dump_digests(cfg, 1000)


def serve_args(cfg, lanes: str | None = None, *extra: str) -> list[str]:
    args = ["--config", str(cfg), *extra]
    return [*args, "--lanes", lanes] if lanes else args


def read(client: DataClient, per_lane: int | None = None) -> dict[int, list[str]]:
    """Chain digests per lane; stop after ``per_lane`` batches of every lane (all consumed)."""
    out: dict[int, list[str]] = {}
    limit = None if per_lane is None else per_lane * len(client.lanes)
    for count, batch in enumerate(client, 1):
        out.setdefault(batch.lane, []).append(batch.chain_digest.hex())
        if limit is not None and count >= limit:
            client.mark_consumed()
            break
    return out


def extend(into: dict[int, list[str]], more: dict[int, list[str]]) -> None:
    for lane, chains in more.items():
        into.setdefault(lane, []).extend(chains)


def from_start(client: DataClient) -> None:
    """Read every lane of ``client`` from seq 0 (another client consumed them before)."""
    client.load_state_dict(
        {
            "version": 1,
            "fingerprint": client.fingerprint,
            "positions": dict.fromkeys(client.lanes, 0),
        }
    )


def test_two_shards_of_four_lanes_equal_one_server_of_eight(setup):
    cfg, work, expected = setup
    with server(serve_args(cfg), work) as one, DataClient(one.address) as client:
        assert read(client) == expected  # one server of eight lanes streams what dump prints
    with (
        server(serve_args(cfg, "0-3"), work) as a,
        server(serve_args(cfg, "4-7"), work) as b,
    ):
        infos = [s.stub().GetInfo(pb.GetInfoRequest()) for s in (a, b)]
        assert [list(i.served_lanes) for i in infos] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert infos[0].fingerprint == infos[1].fingerprint
        assert infos[0].num_lanes == infos[1].num_lanes == 8

        # One rank reading all eight lanes from both shards.
        with DataClient([a.address, b.address], rank=0, world_size=1) as client:
            assert client.routes == {
                lane: (a.address if lane < 4 else b.address) for lane in range(8)
            }
            assert read(client) == expected

        # Four ranks with interleaved lanes: every rank reads from both shards.
        got: dict[int, list[str]] = {}
        for rank in range(4):
            with DataClient(
                [b.address, a.address], rank=rank, world_size=4, interleaved=True
            ) as client:
                assert client.lanes == [rank, rank + 4]
                assert set(client.routes.values()) == {a.address, b.address}
                from_start(client)
                extend(got, read(client))
        assert got == expected


def test_a_lane_not_served_is_invalid_argument(setup):
    cfg, work, _ = setup
    with server(serve_args(cfg, "0-3"), work) as a:
        with pytest.raises(grpc.RpcError) as info:
            read_lane(a.stub(), 5, count=1)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "lane 5 is not served here" in info.value.details()
        assert "[0, 1, 2, 3]" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            a.stub().Checkpoint(
                pb.CheckpointRequest(positions=[pb.LanePosition(lane=6, next_seq=0)])
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A client whose lanes no server serves is refused up front, naming what is served.
        with pytest.raises(Exception, match="served by none of the servers"):
            DataClient(a.address, rank=1, world_size=2)


def test_checkpoint_on_two_shards_resumes_exactly_on_one_server_and_on_other_shards(setup):
    cfg, work, expected = setup
    got: dict[int, list[str]] = {}
    merged_file = work / "merged.ckpt"

    # 1. Two shards; one rank reads 3 batches per lane; each shard checkpoints its lanes.
    with (
        server(serve_args(cfg, "0-3", "--state-dir", str(work / "a")), work) as a,
        server(serve_args(cfg, "4-7", "--state-dir", str(work / "b")), work) as b,
        DataClient([a.address, b.address], rank=0, world_size=1) as client,
    ):
        extend(got, read(client, per_lane=3))
        saved = client.state_dict()
        parts = [client.checkpoint(tag="shards", address=s.address) for s in (a, b)]
    assert [sorted(p.positions) for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert {**parts[0].positions, **parts[1].positions} == dict.fromkeys(range(8), 3)
    states = [ResumeState.decode(p.state) for p in parts]
    assert [sorted(s.lanes) for s in states] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    merged = ResumeState.merge(states)
    assert sorted(merged.lanes) == list(range(8))
    write_atomic(merged_file, merged.encode())
    assert read_state_file(merged_file).positions() == dict.fromkeys(range(8), 3)

    # 2. One server of all eight lanes resumes the combined checkpoint and continues exactly.
    with server(serve_args(cfg, None, "--resume", str(merged_file)), work) as one:
        info = one.stub().GetInfo(pb.GetInfoRequest())
        assert list(info.served_lanes) == list(range(8))
        assert {p.lane: p.next_seq for p in info.acknowledged} == dict.fromkeys(range(8), 3)
        with DataClient(one.address, rank=0, world_size=1) as client:
            client.load_state_dict(saved)  # the chains must continue where the shards stopped
            extend(got, read(client, per_lane=2))
            saved = client.state_dict()
            whole = client.checkpoint(tag="one")
    assert whole.positions == dict.fromkeys(range(8), 5)
    whole_file = work / "whole.ckpt"
    write_atomic(whole_file, whole.state)

    # 3. Its checkpoint resumes on two uneven shards (six lanes and two), to the end.
    with (
        server(serve_args(cfg, "0-5", "--resume", str(whole_file)), work) as c,
        server(serve_args(cfg, "6-7", "--resume", str(whole_file)), work) as d,
        DataClient([c.address, d.address], rank=0, world_size=1) as client,
    ):
        client.load_state_dict(saved)
        extend(got, read(client))
    assert got == expected


def test_each_shard_resumes_its_own_checkpoint_by_address(setup):
    cfg, work, expected = setup
    with (
        server(serve_args(cfg, "0-3"), work) as a,
        server(serve_args(cfg, "4-7"), work) as b,
        DataClient([a.address, b.address], rank=0, world_size=1) as client,
    ):
        read(client, per_lane=3)
        parts = {s.address: client.checkpoint(tag="p", address=s.address) for s in (a, b)}
        read(client, per_lane=2)
        # One shard reset: only its lanes go back, the other shard's keep their positions.
        client.resume(state=parts[a.address].state, address=a.address)
        assert client.positions == {**dict.fromkeys(range(4), 3), **dict.fromkeys(range(4, 8), 5)}
        client.resume(state=parts[b.address].state, address=b.address)
        assert client.positions == dict.fromkeys(range(8), 3)
        again = read(client, per_lane=2)
        assert again == {lane: chains[3:5] for lane, chains in expected.items()}
        # Without address= every server gets the bytes: the second shard refuses a checkpoint
        # of the first one's lanes, and the error says the first was reset to it.
        with pytest.raises(ZephonClientError, match=f"already resumed to it: {a.address}"):
            client.resume(state=parts[a.address].state)


def test_merging_overlapping_or_foreign_checkpoints_is_refused(setup, tmp_path, corpus_dir):
    cfg, work, _ = setup
    other = write_config(
        tmp_path / "other.yaml", corpus_dir, lanes=8, chunk_size=8, seed=99, end_of_data="longest"
    )
    with (
        server(serve_args(cfg, "0-3"), work) as a,
        server(serve_args(other, "4-7"), work) as b,
    ):
        state_a = ResumeState.decode(a.stub().Checkpoint(pb.CheckpointRequest()).state)
        state_b = ResumeState.decode(b.stub().Checkpoint(pb.CheckpointRequest()).state)
        # The client refuses servers of different pipelines up front.
        with pytest.raises(Exception, match="different pipelines"):
            DataClient([a.address, b.address])
    from zephon_server.engine.checkpoint import CheckpointError, IncompatibleCheckpoint

    with pytest.raises(IncompatibleCheckpoint, match="different pipelines"):
        ResumeState.merge([state_a, state_b])
    with pytest.raises(CheckpointError, match=r"overlap on lanes \[0, 1, 2, 3\]"):
        ResumeState.merge([state_a, state_a])
