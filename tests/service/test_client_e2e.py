"""The trainer client against a real server: ranks, resume on another rank count, tail."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_client import DataClient, merge_state_dicts
from zephon_testing.servers import dump_digests, server, write_config

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus_dir):
    work = tmp_path_factory.mktemp("client-e2e")
    cfg = write_config(work / "pipeline.yaml", corpus_dir, lanes=8, chunk_size=8)
    return cfg, work, dump_digests(cfg, 1000)


def read(client, limit=None):
    out: dict[int, list[str]] = {}
    order = []
    for batch in client:
        out.setdefault(batch.lane, []).append(batch.chain_digest.hex())
        order.append(batch.lane)
        if limit is not None and len(order) >= limit:
            client.mark_consumed()
            break
    return out, order


def test_two_ranks_stream_what_dump_prints(setup):
    cfg, work, expected = setup
    with server(["--config", str(cfg)], work) as srv:
        got: dict[int, list[str]] = {}
        for rank in range(2):
            with DataClient(srv.address, rank=rank, world_size=2) as client:
                assert client.lanes == list(range(rank * 4, rank * 4 + 4))
                lanes, order = read(client)
                got.update(lanes)
                # Strict round-robin while every lane still has data.
                shortest = min(len(v) for v in lanes.values())
                assert order[: 4 * shortest] == client.lanes * shortest
        info_acks = {
            p.lane: p.next_seq
            for p in srv.stub()
            .GetInfo(
                __import__("zephon_proto.v1.data_service_pb2", fromlist=["x"]).GetInfoRequest()
            )
            .acknowledged
        }
    assert got == expected
    assert info_acks == {lane: len(v) for lane, v in expected.items()}


def test_resume_on_four_ranks_from_two_ranks_state(setup):
    cfg, work, expected = setup
    with server(["--config", str(cfg), "--state-dir", str(work / "state")], work) as srv:
        got: dict[int, list[str]] = {lane: [] for lane in range(8)}
        states = []
        for rank in range(2):
            with DataClient(srv.address, rank=rank, world_size=2) as client:
                lanes, _ = read(client, limit=4 * 3)  # 3 batches per lane
                for lane, chains in lanes.items():
                    got[lane].extend(chains)
                states.append(client.state_dict())
    merged = merge_state_dicts(states)
    with server(["--config", str(cfg), "--runner", "processes"], work) as srv:
        for rank in range(4):
            with DataClient(srv.address, rank=rank, world_size=4) as client:
                client.load_state_dict(merged)
                lanes, _ = read(client)
                for lane, chains in lanes.items():
                    got[lane].extend(chains)
    assert got == expected


def test_tail_prints_decoded_text(setup):
    cfg, work, _ = setup
    with server(["--config", str(cfg)], work) as srv:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "zephon_server.cli",
                "tail",
                "--address",
                srv.address,
                "--lane",
                "3",
                "--count",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 0, res.stderr
    assert "lane 3 seq 0" in res.stdout and "lane 3 seq 1" in res.stdout
    words = sum(w.isalpha() for w in res.stdout.split())
    assert words > 20  # byte tokens decoded back to text


def test_tail_waits_for_a_server_that_is_starting_when_asked(setup):
    cfg, work, _ = setup
    with socket.socket() as probe:  # a free port for the server to come
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "zephon_server.cli", "tail", "--address", f"127.0.0.1:{port}"]
    cmd += ["--lane", "1", "--count", "1", "--no-decode"]
    at_once = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert at_once.returncode == 2
    assert "nothing listens at" in at_once.stderr and "--wait SECONDS" in at_once.stderr
    waiting = subprocess.Popen([*cmd, "--wait", "90"], stdout=subprocess.PIPE, text=True)
    try:
        with server(["--config", str(cfg), "--port", str(port)], work):
            out, _ = waiting.communicate(timeout=90)
    finally:
        waiting.kill()
    assert waiting.returncode == 0 and out.startswith("lane 1 seq 0"), out


def test_the_demo_trainer_checkpoints_what_it_trained_on(setup):
    cfg, work, _ = setup
    demo = [sys.executable, str(Path(__file__).parents[2] / "examples" / "demo_trainer.py")]
    with server(["--config", str(cfg)], work) as srv:
        done = subprocess.run(
            [*demo, "--address", srv.address, "--steps", "16", "--checkpoint-every", "16"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        # 16 steps over 8 lanes: two batches of every lane trained on, the last one included
        assert "at {0: 2, 1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2}" in done.stderr, done.stderr
        ranks = subprocess.run(
            [*demo, "--address", srv.address, "--world-size", "2", "--checkpoint-every", "5"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ranks.returncode == 2 and "must be merged" in ranks.stderr


def test_a_new_client_starts_where_a_closed_one_stopped(setup):
    # Acks are coalesced (every 4 batches or 0.5 s); close() must send the rest so that the
    # server's acknowledged positions, where a client without a state starts, are exact.
    cfg, work, expected = setup
    with server(["--config", str(cfg)], work) as srv:
        with DataClient(srv.address) as first:
            lanes, _ = read(first, limit=27)
            positions = first.positions
        assert positions == {lane: len(v) for lane, v in lanes.items()}
        info = srv.stub().GetInfo(
            __import__("zephon_proto.v1.data_service_pb2", fromlist=["x"]).GetInfoRequest()
        )
        assert {p.lane: p.next_seq for p in info.acknowledged} == positions
        with DataClient(srv.address) as second:
            assert second.positions == positions
            rest, _ = read(second, limit=8)
        for lane, digests in rest.items():
            start = positions[lane]
            assert digests == expected[lane][start : start + len(digests)]


def test_a_tensor_parallel_peer_that_connects_late_reads_what_its_peer_read(setup):
    # Two ranks of one data-parallel group (world 2, data_parallel_size 1) read the same
    # lanes. Rank 1 connects after rank 0 consumed 20 batches: it starts where the run
    # started, not where rank 0 is, so both get identical batches.
    cfg, work, expected = setup
    with server(["--config", str(cfg)], work) as srv:
        early = DataClient(srv.address, rank=0, world_size=2, data_parallel_size=1)
        first, order = read(early, limit=20)
        early.close()  # its acks reach the server: the lanes' acknowledged positions move on
        late = DataClient(srv.address, rank=1, world_size=2, data_parallel_size=1)
        assert late.positions == dict.fromkeys(range(8), 0)
        second, _ = read(late, limit=20)
        late.close()
        assert second == first
        # Rank 0 again (a restart without a state): where it left off, by its own name.
        again = DataClient(srv.address, rank=0, world_size=2, data_parallel_size=1)
        assert again.positions == {lane: len(v) for lane, v in first.items()} | {
            lane: 0 for lane in range(8) if lane not in first
        }
        again.close()
        # Without a consumer, GetInfo still answers every lane's acknowledged position.
        from zephon_proto.v1 import data_service_pb2 as pb

        acks = {p.lane: p.next_seq for p in srv.stub().GetInfo(pb.GetInfoRequest()).acknowledged}
        assert acks == again.positions
    assert all(v == expected[lane][: len(v)] for lane, v in first.items())
    assert len(order) == 20
