"""Shared replays: streams opened at seqs the server no longer keeps share one regeneration.

Thirty streams opened at one evicted seq of a lane (and a few more at other seqs of the same
epoch) are served by a single replay: every stream gets the batches ``zephon dump`` gives,
the replay counter says 1, and the server's threads grow by the streams' own threads, not by
a pipeline per stream. ``--max-replays`` caps concurrent replays (RESOURCE_EXHAUSTED naming
the limit and the fix; 0 turns replays off: OUT_OF_RANGE). A replay reader is handed back to
the live log as soon as the log holds its next seq, and the replay then ends.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from zephon_server.delivery.hub import LaneHub
from zephon_server.engine.config import load_config
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_testing.scenarios.faults import wait_until
from zephon_testing.scenarios.load import metric, scrape
from zephon_testing.scenarios.replays import (
    LANE_BATCHES,
    READ_FIRST,
    Stream,
    make_setup,
    mid_epoch_seqs,
    read_ahead,
    run_thirty_streams,
    serve,
)
from zephon_testing.servers import (
    read_lane,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus_dir):
    """A two-lane pipeline with long lanes and 4-chunk epochs, its dump of lane 0, and for
    each position of lane 0 the epoch boundary a resume there regenerates from."""
    return make_setup(tmp_path_factory.mktemp("replays"), corpus_dir)


@pytest.mark.service
@pytest.mark.timeout(180)
def test_thirty_streams_at_one_evicted_seq_share_one_replay(setup):
    run_thirty_streams(setup)


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
            assert isinstance(item, NumberedBatch) and item.seq == seq
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
    release_all = shm.release_all
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
    release_all()  # what the stand-in kept: this process's blocks, left to no later test


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
