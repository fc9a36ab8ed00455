"""end_of_data over gRPC (issue 22, section 4): every rank takes the same number of steps.

Real ``zephon serve`` processes over loopback serve the default pipeline's finite variant
(every dataset ``exhaustion: stop``) on 4 lanes, whose lanes end at different seqs by
themselves (``longest``). With the default ``shortest`` every lane ends at the shortest lane's
end, whatever the number of ranks reading, with the slowest reader, a lone reader, and after
a resume at uneven positions; the streams are prefixes of the ``longest`` ones and what ``zephon
dump`` prints; the cut batches are counted on ``/metrics``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import pytest

from zephon_client import DataClient
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.execution import ExecutionConfig
from zephon_testing.infra import free_port
from zephon_testing.servers import read_lane, serve_once, server, write_config

pytestmark = [pytest.mark.service, pytest.mark.timeout(300)]

PIPELINE = '''
from zephon_server.defaults import default_pipeline_specs
from zephon_server.engine.pipeline import Pipeline


def build(end_of_data="shortest"):
    """The embedded default pipeline (its datasets stop when exhausted) on 4 lanes."""
    specs = default_pipeline_specs(DATA)
    pipe = Pipeline(specs, seed=1234, lanes=4, chunk_size=256, flush_every_k_chunks=8,
                    end_of_data=end_of_data)
    pipe.decode_text().tokenize(tokenizer="byte", add_eos=True).pack_flat(max_length=1024)
    return pipe.shuffle(buffer_size=256, algorithm="streaming").batch(microbatch_size=8)


def build_longest():
    return build("longest")
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The pipeline file, a work dir, and the ``longest`` streams (in-process, inline)."""
    work = tmp_path_factory.mktemp("lane-ends")
    source = work / "default4.py"
    source.write_text(f"DATA = {str(work / 'data')!r}\n" + PIPELINE)
    sys.path.insert(0, str(work))
    try:
        import default4  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(work))
    pipe = default4.build_longest()
    assert {d.exhaustion for d in pipe.datasets} == {"stop"}
    longest: dict[int, list[str]] = {lane: [] for lane in range(4)}
    for batch in pipe.run(ExecutionConfig(runner="inline")).batches():
        longest[batch.lane_id].append(batch.chain_digest.hex())
    rows = sum(d.num_rows for d in pipe.plan().datasets)
    return source, work, longest, rows


def args(source: Path, *extra: str, build: str = "build") -> list[str]:
    return ["--pipeline", f"{source}:{build}", "--max-ahead", "4", *extra]


def common_end(longest: dict[int, list[str]]) -> int:
    return min(len(v) for v in longest.values())


def read_rank(address: str, rank: int, world: int, out: dict, sleep: float = 0.0) -> None:
    """One data-parallel rank: every batch of its lanes; records chains, steps and ends."""
    chains: dict[int, list[str]] = {}
    closed: Counter = Counter()
    with DataClient(address, rank=rank, world_size=world, consumer=f"rank{rank}") as client:
        for batch in client:
            chains.setdefault(batch.lane, []).append(batch.chain_digest.hex())
            closed.update(tuple(c)[:4] for c in batch.closed)
            time.sleep(sleep)
        ends = client.lane_ends
        for end in ends.values():
            closed.update(tuple(c)[:4] for c in end.closed)
        out[rank] = (chains, {lane: e.next_seq for lane, e in ends.items()}, closed)


def run_ranks(address: str, world: int, sleeps: dict[int, float] | None = None) -> dict:
    out: dict = {}
    threads = [
        threading.Thread(
            target=read_rank, args=(address, r, world, out, (sleeps or {}).get(r, 0.0))
        )
        for r in range(world)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a rank never finished (deadlock?)"
    assert sorted(out) == list(range(world))
    return out


def metrics(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def value(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_shortest_ends_every_lane_at_the_shortest_end_with_longest_prefixes(setup):
    source, work, longest, rows = setup
    end = common_end(longest)
    assert len({len(v) for v in longest.values()}) > 1, longest  # lanes differ by themselves
    port = free_port()
    with server(args(source, "--metrics-port", str(port)), work) as srv:
        (chains, ends, closed) = run_ranks(srv.address, 1)[0]
        assert ends == dict.fromkeys(range(4), end)
        assert chains == {lane: v[:end] for lane, v in longest.items()}
        # Every document closed exactly once: delivered, dropped, or cut (by the lane's end).
        assert set(closed.values()) == {1} and len(closed) == rows
        text = metrics(port)
        assert value(text, "zephon_lane_batches_cut_total") == sum(
            len(v) - end for v in longest.values()
        )
        assert value(text, "zephon_lanes_common_end") == end
        # Produced counts the cut batches too; the lag does not (they are never acknowledged).
        for lane, chain in longest.items():
            assert value(text, f'zephon_lane_batches_produced_total{{lane="{lane}"}}') == len(chain)
            assert value(text, f'zephon_consumer_lag_batches{{lane="{lane}"}}') == 0, text
        # A checkpoint past the common end is refused as such, for the lane that produced
        # past it (its cut batches) and for one that ended there (never produced).
        shortest_lane = min(longest, key=lambda n: len(longest[n]))
        longest_lane = max(longest, key=lambda n: len(longest[n]))
        with DataClient(srv.address) as client:
            for lane in (longest_lane, shortest_lane):
                with pytest.raises(Exception, match=rf"position {end + 1} is past the common end"):
                    client.checkpoint(positions={lane: end + 1})
            assert client.checkpoint(positions={longest_lane: end}).positions[longest_lane] == end
    # zephon dump prints the same streams (it runs every lane, even for one of them).
    dump = subprocess.run(
        [sys.executable, "-m", "zephon_server.cli", "dump", "--pipeline", f"{source}:build",
         "--format", "digest", "--batches", "1000", "--lanes", "2"],
        capture_output=True, text=True, timeout=240, check=True, cwd=work,
    )  # fmt: skip
    assert [line.split()[2] for line in dump.stdout.splitlines()] == longest[2][:end]
    with server(args(source, build="build_longest"), work) as srv:
        (chains, ends, _) = run_ranks(srv.address, 1)[0]
        assert chains == longest  # longest: every lane to its own end, as before
        assert ends == {lane: len(v) for lane, v in longest.items()}


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_takes_the_same_number_of_steps(setup, world):
    source, work, longest, _ = setup
    end = common_end(longest)
    with server(args(source), work) as srv:
        # The last rank reads slowly: the others wait at the frontier, nobody hangs.
        out = run_ranks(srv.address, world, sleeps={world - 1: 0.01})
    steps = set()
    for chains, ends, _ in out.values():
        assert ends == dict.fromkeys(chains, end)
        assert chains == {lane: longest[lane][:end] for lane in chains}
        steps.add(sum(len(v) for v in chains.values()))
    assert steps == {end * 4 // world}


def test_a_lone_reader_of_one_lane_reaches_the_common_end(setup):
    """Nobody reads the other lanes: they are produced for the frontier (kept up to their
    cap, then not kept), so the reader neither hangs nor gets a batch past the end."""
    source, work, longest, _ = setup
    end = common_end(longest)
    with server(args(source), work) as srv:
        batches, last = read_lane(srv.stub(), 1, count=None, consumer="alone")
        assert [b.chain_digest.hex() for b in batches] == longest[1][:end]
        assert last is not None and last.next_seq == end
        # Past the lane's own end (cut batches counted) is never "not yet reachable".
        beyond = max(len(v) for v in longest.values()) + 1
        with pytest.raises(grpc.RpcError) as caught:
            read_lane(srv.stub(), 1, start_seq=beyond, consumer="late")
        assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert (
            f"lane 1: seq {beyond} is past the lane's end: it ends at seq {end}, the "
            "common end of every lane" in caught.value.details()
        )


def test_a_resume_at_uneven_positions_on_other_ranks_ends_at_the_same_seq(setup):
    source, work, longest, _ = setup
    end = common_end(longest)
    state = work / "state"
    with (
        server(args(source, "--state-dir", str(state)), work) as srv,
        DataClient(srv.address) as client,
    ):
        for count, _ in enumerate(client, 1):
            if count == 12:
                break
        positions = {0: 1, 1: 3, 2: 0, 3: 2}
        info = client.checkpoint(positions=positions)
    assert info.positions == positions
    with server(args(source, "--state-dir", str(state), "--resume", info.id), work) as srv:
        infos = srv.stub().GetInfo(pb.GetInfoRequest())
        assert {p.lane: p.next_seq for p in infos.acknowledged} == positions
        out = run_ranks(srv.address, 2)
        for chains, ends, _ in out.values():
            assert ends == dict.fromkeys(chains, end)
            assert chains == {lane: longest[lane][positions[lane] : end] for lane in chains}
        # A resume at the end itself: every lane is over at once, on 4 ranks now.
        with DataClient(srv.address) as client:
            at_end = client.checkpoint(positions=dict.fromkeys(range(4), end))
            client.resume(state=at_end.state)
        out = run_ranks(srv.address, 4)
        for chains, ends, _ in out.values():
            assert chains == {} and set(ends.values()) == {end}


def test_a_lane_sharded_server_refuses_shortest_on_finite_data(setup):
    source, work, _, _ = setup
    res = serve_once(args(source, "--lanes", "0-1"), work)
    assert res.returncode != 0
    assert "end_of_data: shortest needs every lane in one server" in res.stderr
    assert "set end_of_data: longest" in res.stderr
    # A lane that does not exist is named first: dropping it is the fix, not the policy.
    res = serve_once(args(source, "--lanes", "0-9"), work)
    assert res.returncode != 0 and "end_of_data" not in res.stderr, res.stderr
    assert "lane 4 does not exist; the pipeline has lanes 0..3" in res.stderr, res.stderr


@pytest.mark.parametrize("policy", ["shortest", "longest"])
def test_get_info_reports_end_of_data_and_the_common_end_once_known(tmp_path, corpus_dir, policy):
    """GetInfo names the setting; with ``shortest`` it reports no common end before any lane
    could have ended (nothing read, the producer held at ``--max-ahead``), then, once every
    lane is read to its end, the end every lane delivered. ``longest`` never has one."""
    config = write_config(tmp_path / "pipeline.yaml", corpus_dir, lanes=3, end_of_data=policy)
    with server(["--config", str(config), "--max-ahead", "1"], tmp_path) as srv:
        stub = srv.stub()
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=30)
        assert info.end_of_data == policy and f"end_of_data: {policy} (" in info.plan
        assert not info.HasField("common_end_seq")
        first, _ = read_lane(stub, 0, count=2, consumer="peek")
        assert len(first) == 2
        assert not stub.GetInfo(pb.GetInfoRequest(), timeout=30).HasField("common_end_seq")
        delivered = {}
        for lane in range(3):
            batches, end = read_lane(stub, lane, consumer=f"rank{lane}")
            assert end is not None and end.next_seq == len(batches)
            delivered[lane] = len(batches)
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=30)
    if policy == "shortest":
        assert info.HasField("common_end_seq")
        assert delivered == dict.fromkeys(range(3), info.common_end_seq)
        assert info.common_end_seq > 2
    else:
        assert not info.HasField("common_end_seq")
        assert len(set(delivered.values())) > 1, delivered  # the lanes differ by themselves
