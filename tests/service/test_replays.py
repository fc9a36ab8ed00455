"""Shared replays: streams opened at seqs the server no longer keeps share one regeneration.

Thirty streams opened at one evicted seq of a lane (and a few more at other seqs of the same
epoch) are served by a single replay: every stream gets the batches ``zephon dump`` gives,
the replay counter says 1, and the server's threads grow by the streams' own threads, not by
a pipeline per stream. ``--max-replays`` caps concurrent replays (RESOURCE_EXHAUSTED naming
the limit and the fix; 0 turns replays off: OUT_OF_RANGE). A replay reader is handed back to
the live log as soon as the log holds its next seq, and the replay then ends.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.reliability.test_faults import proc_stats, wait_until
from tests.reliability.test_load import metric, scrape
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.config import load_config
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.hub import LaneHub
from zephon_server.engine.records import SampleBatch
from zephon_testing.infra import free_port
from zephon_testing.servers import (
    ServerProcess,
    dump_digests,
    open_request,
    read_lane,
    response_batches,
    write_config,
)

READ_FIRST = 300  # batches of lane 0 read (and acknowledged) before the replays
KEEP = 64  # consumed batches the server keeps (LaneHub.keep_consumed)
LANE_BATCHES = 400  # of lane 0 in the reference dump


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus_dir):
    """A two-lane pipeline with long lanes and 4-chunk epochs, its dump of lane 0, and for
    each position of lane 0 the epoch boundary a resume there regenerates from."""
    return make_setup(tmp_path_factory.mktemp("replays"), corpus_dir)


def make_setup(work: Path, corpus_dir: Path):
    """The module's setup in ``work`` (also used by tools/reliability_hardening.py)."""
    cfg = write_config(
        work / "replays.yaml",
        corpus_dir,
        lanes=2,
        k=4,
        exhaustion="repeat",  # endless lanes: a replay's pipeline lives as long as its readers
        extra_ops=[{"pack_flat": {"max_length": 128}}, {"shuffle": {"buffer_size": 8}}],
        batch=2,
    )
    dump = dump_digests(cfg, LANE_BATCHES, lanes="0")[0]
    pipeline, _ = load_config(cfg)
    run = pipeline.run(ExecutionConfig(runner="inline"), lanes=[0])
    for batch in run.batches():
        if batch.seq + 1 == LANE_BATCHES:
            break
    boundaries = [run.checkpoint({0: p}).lanes[0].boundary_chunk for p in range(LANE_BATCHES)]
    run.close()
    epochs = {p: (b, boundaries.index(b)) for p, b in enumerate(boundaries)}
    return cfg, work, dump, epochs


def mid_epoch_seqs(epochs, below: int, count: int) -> list[int]:
    """``count`` seqs of one epoch below ``below``, none of them the epoch's first cut."""
    by_boundary: dict[int, list[int]] = {}
    for p, (boundary, first) in epochs.items():
        if 0 < p < below and p > first:
            by_boundary.setdefault(boundary, []).append(p)
    for seqs in by_boundary.values():
        if len(seqs) >= count + 4:
            return seqs[2 : 2 + count]
    raise AssertionError("no epoch long enough")


class Stream:
    """A raw StreamBatches call on its own thread: reads one batch, waits for ``go``, then
    reads (acknowledging) until it has ``count`` batches."""

    def __init__(self, stub, lane: int, seq: int, count: int, go: threading.Event, name: str):
        self.seq, self.count, self.go = seq, count, go
        self.chains: list[str] = []
        self.error: grpc.RpcError | None = None
        self.started = threading.Event()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put(open_request(lane, seq, name))
        self.call = stub.StreamBatches(self._gen(), timeout=120)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _gen(self):
        while (item := self._requests.get()) is not None:
            yield item

    def _run(self) -> None:
        try:
            for resp in self.call:
                batches = response_batches(resp)
                self.chains += [b.chain_digest.hex() for b in batches]
                self.started.set()
                self.go.wait()
                self._requests.put(
                    pb.StreamBatchesRequest(ack=pb.Ack(next_seq=batches[-1].seq + 1))
                )
                if len(self.chains) >= self.count:
                    break
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.started.set()
            self._requests.put(None)
            self.call.cancel()


def serve(cfg: Path, work: Path, *extra: str) -> tuple[ServerProcess, int]:
    mport = free_port()
    args = ["--config", str(cfg), "--max-ahead", "8", "--metrics-port", str(mport), *extra]
    return ServerProcess(args, work), mport


def read_ahead(srv: ServerProcess) -> None:
    """Lane 0 read and acknowledged up to READ_FIRST: its older batches are evicted."""
    batches, _ = read_lane(srv.stub(), 0, count=READ_FIRST, consumer="ahead")
    assert len(batches) >= READ_FIRST


@pytest.mark.service
@pytest.mark.timeout(180)
def test_thirty_streams_at_one_evicted_seq_share_one_replay(setup):
    run_thirty_streams(setup)


def run_thirty_streams(setup) -> dict[str, int]:
    """Thirty streams at one evicted seq of lane 0 and four at other seqs of its epoch, on a
    real server: every stream gets `zephon dump`'s batches from one shared replay. Returns the
    streams, replays started and the server's threads and RSS (MB) before and during."""
    cfg, work, dump, epochs = setup
    srv, mport = serve(cfg, work)
    streams: list[Stream] = []
    try:
        read_ahead(srv)
        target, *others = mid_epoch_seqs(epochs, READ_FIRST - KEEP - 20, 4)
        before = proc_stats(srv.proc.pid)
        go = threading.Event()
        seqs = [target] * 30 + others
        stub = srv.stub()
        streams = [Stream(stub, 0, s, 24, go, f"r{i}") for i, s in enumerate(seqs)]
        assert all(s.started.wait(60) for s in streams)
        during = proc_stats(srv.proc.pid)
        text = scrape(mport)
        go.set()
        for s in streams:
            s.thread.join(60)
        assert [s.error for s in streams if s.error] == []
        for s in streams:
            assert s.chains[:24] == dump[s.seq : s.seq + 24], s.seq
        assert metric(text, "zephon_replays_started_total") == 1
        assert metric(text, "zephon_replay_readers") == len(seqs)
        # Each stream has its handler and ack-reader threads; one replay adds a pipeline's.
        grown = during["threads"] - before["threads"]
        print(
            f"threads {before['threads']} -> {during['threads']}, "
            f"RSS {before['rss'] >> 20} -> {during['rss'] >> 20} MB"
        )
        assert grown <= 2 * len(seqs) + 20, (before, during)
        assert during["rss"] - before["rss"] < 150 << 20, (before, during)
        assert wait_until(lambda: metric(scrape(mport), "zephon_replays_running") == 0, 10)
    finally:
        for s in streams:
            s.call.cancel()
        assert srv.terminate() == 0, srv.output()[-3000:]
    return {
        "streams": len(seqs),
        "replays": int(metric(text, "zephon_replays_started_total")),
        "threads_before": before["threads"],
        "threads_during": during["threads"],
        "rss_before_mb": before["rss"] >> 20,
        "rss_during_mb": during["rss"] >> 20,
    }


@pytest.mark.service
@pytest.mark.timeout(180)
def test_max_replays_refuses_another_boundary_then_admits_it_later(setup):
    cfg, work, dump, epochs = setup
    srv, mport = serve(cfg, work, "--max-replays", "1")
    try:
        read_ahead(srv)
        first = mid_epoch_seqs(epochs, 120, 1)[0]
        other = next(p for p in range(first + 60, 210) if epochs[p][0] > epochs[first][0])
        go = threading.Event()
        holder = Stream(srv.stub(), 0, first, 10, go, "holder")
        assert holder.started.wait(60) and holder.error is None
        with pytest.raises(grpc.RpcError) as refused:
            read_lane(srv.stub(), 0, other, count=1, consumer="second")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.value.details()
        assert f"lane 0: seq {other} needs a replay" in details
        assert "(--max-replays 1); raise --max-replays, or reconnect later" in details
        assert metric(scrape(mport), "zephon_replays_refused_total") == 1
        # A stream at a seq the running replay serves joins it: no second replay needed.
        joined, _ = read_lane(srv.stub(), 0, first + 1, count=3, consumer="joiner")
        assert [b.chain_digest.hex() for b in joined] == dump[first + 1 : first + 4]
        go.set()
        holder.thread.join(30)
        holder.call.cancel()
        assert wait_until(lambda: metric(scrape(mport), "zephon_replays_running") == 0, 10)
        later, _ = read_lane(srv.stub(), 0, other, count=3, consumer="second")
        assert [b.chain_digest.hex() for b in later] == dump[other : other + 3]
    finally:
        assert srv.terminate() == 0, srv.output()[-3000:]


@pytest.mark.service
@pytest.mark.timeout(120)
def test_max_replays_zero_answers_evicted_seqs_out_of_range(setup):
    cfg, work, _, _ = setup
    srv, _ = serve(cfg, work, "--max-replays", "0")
    try:
        read_ahead(srv)
        with pytest.raises(grpc.RpcError) as refused:
            read_lane(srv.stub(), 0, 10, count=1, consumer="late")
        assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "replays are off (--max-replays 0)" in refused.value.details()
    finally:
        assert srv.terminate() == 0, srv.output()[-3000:]


@pytest.mark.timeout(120)
def test_a_replay_reader_moves_to_the_live_log_and_the_replay_ends(setup):
    cfg, _, dump, _ = setup
    pipeline, execution = load_config(cfg)
    hub = LaneHub(pipeline, execution, lanes=[0], max_ahead=8)
    hub.start()
    try:
        ahead = hub.open(0, "ahead", 0)
        for seq in range(READ_FIRST):
            assert next(ahead).seq == seq
            hub.ack(0, "ahead", seq + 1)
        start = 40
        late = hub.open(0, "late", start)
        assert hub.stats()["replays"] == {
            "running": 1,
            "readers": 1,
            "started": 1,
            "refused": 0,
            "limit": 4,
        }
        got = []
        for seq in range(start, READ_FIRST + 5):
            item = next(late)
            assert isinstance(item, SampleBatch) and item.seq == seq
            got.append(item.chain_digest.hex())
            hub.ack(0, "late", seq + 1)
            if seq == READ_FIRST - 10:  # the live log holds these: it reads from there
                assert hub.stats()["replays"]["readers"] == 0
        assert got == dump[start : READ_FIRST + 5]
        deadline = time.monotonic() + 10
        while hub.stats()["replays"]["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hub.stats()["replays"]["running"] == 0
    finally:
        hub.stop()


@pytest.mark.service
def test_a_bad_max_replays_fails_at_start_up(setup):
    from zephon_testing.servers import serve_once

    cfg, work, _, _ = setup
    res = serve_once(["--config", str(cfg), "--max-replays", "-1"], work)
    assert res.returncode == 2
    assert "--max-replays must be a whole number between 0 and 1024" in res.stderr


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_replay_run_leaves_the_processes_shared_memory_to_the_hubs_run(corpus_specs, monkeypatch):
    """Closing a replay (processes runner) must not unlink the shared-memory blocks of the
    hub's own run, which shares the process; the hub's run releases them when it closes."""
    from zephon_server.engine import shm
    from zephon_server.engine.pipeline import Pipeline
    from zephon_server.engine.run import PipelineRun

    released: list[int] = []
    monkeypatch.setattr(shm, "release_all", lambda: released.append(1) or 0)
    pipe = Pipeline(corpus_specs, lanes=2, chunk_size=8, flush_every_k_chunks=2)
    plan = (
        pipe.decode_text()
        .tokenize(tokenizer="byte")
        .batch(microbatch_size=2)
        .plan(ExecutionConfig(runner="processes", workers=1))
    )
    for owner in (False, True):
        run = PipelineRun(plan, lanes=[0], release_shared_memory=owner)
        assert next(run.batches()).seq == 0
        run.close()
        assert bool(released) == owner, owner


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_hub_replays_on_the_processes_runner(setup):
    """A replay beside the hub's run, both on worker processes: the replay's batches are the
    dump's, and the hub's lane goes on exactly after the replay ended."""
    cfg, _, dump, _ = setup
    pipeline, _ = load_config(cfg)
    hub = LaneHub(pipeline, ExecutionConfig(runner="processes", workers=1), lanes=[0], max_ahead=8)
    hub.start()
    try:
        ahead = hub.open(0, "ahead", 0)
        for seq in range(150):
            assert next(ahead).chain_digest.hex() == dump[seq]
            hub.ack(0, "ahead", seq + 1)
        late = hub.open(0, "late", 20)
        assert [next(late).chain_digest.hex() for _ in range(10)] == dump[20:30]
        hub.close_consumer(0, "late")
        deadline = time.monotonic() + 30
        while hub.stats()["replays"]["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hub.stats()["replays"]["running"] == 0
        for seq in range(150, LANE_BATCHES):
            assert next(ahead).chain_digest.hex() == dump[seq]
            hub.ack(0, "ahead", seq + 1)
    finally:
        hub.stop()
