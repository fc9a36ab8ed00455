"""The hub's memory bound: its producer waits while a lane's log is full: the tests that need a
subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_backpressure.py``.
"""

from __future__ import annotations

import time

import pytest

from tests.unit.test_backpressure import (
    MAX_AHEAD,
)
from zephon_server.delivery.hub import LaneHub, headroom
from zephon_server.engine.checkpoint import ResumeState
from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.replay_cache import ReplayCache

LIMIT = MAX_AHEAD + headroom(MAX_AHEAD)  # 10


def settled(hub: LaneHub, quiet: float = 0.5, timeout: float = 30) -> dict[int, int]:
    """The produced positions once nothing new was produced for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last, since = hub.produced(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = hub.produced()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"production never settled: {last}")


def waiting_on(hub: LaneHub, lane: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub.stats()["producer_waiting_on"] == lane:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_without_consumers_a_lane_stops_at_the_bound_not_at_the_chunk_end(make_hub, runner):
    hub = make_hub(lanes=1, runner=runner)
    assert settled(hub) == {0: LIMIT}
    assert waiting_on(hub, 0)
    assert hub.stats()["lanes"][0]["buffered"] == LIMIT


@pytest.mark.timeout(60)
def test_an_ack_lets_the_waiting_producer_on(make_hub):
    hub = make_hub()
    hub.open(0, "c", 0)
    assert settled(hub) == {0: LIMIT}
    hub.ack(0, "c", 6)
    assert settled(hub) == {0: 6 + LIMIT}
    assert hub.stats()["lanes"][0]["unconsumed"] == LIMIT


@pytest.mark.timeout(60)
def test_a_closing_consumer_lets_the_waiting_producer_on(make_hub):
    hub = make_hub()
    hub.open(0, "slow", 0)
    hub.open(0, "fast", 0)
    hub.ack(0, "fast", 7)
    assert settled(hub) == {0: LIMIT}  # held back by the slow one
    hub.close_consumer(0, "slow")
    assert settled(hub) == {0: 7 + LIMIT}


@pytest.mark.timeout(60)
def test_stop_ends_a_waiting_producer_at_once(make_hub):
    hub = make_hub()
    assert waiting_on(hub, 0)
    thread = hub._thread
    started = time.monotonic()
    hub.stop()
    assert time.monotonic() - started < 5
    assert thread is not None and not thread.is_alive()


@pytest.mark.timeout(60)
def test_resume_replaces_a_waiting_producer(make_hub):
    hub = make_hub()
    assert settled(hub) == {0: LIMIT}
    assert waiting_on(hub, 0)
    _, _, state = hub.checkpoint({0: 4})
    old = hub._thread
    assert hub.resume(state) == {0: 4}
    assert old is not None and not old.is_alive()
    assert settled(hub) == {0: 4 + LIMIT}
    assert waiting_on(hub, 0)


@pytest.mark.timeout(60)
def test_a_checkpoint_waiting_for_one_lane_is_not_stuck_behind_another_full_lane(make_hub):
    """Lane 1 (no consumer) holds the producer back with lane 0's next batches behind it in
    the pipeline; a checkpoint at a position lane 0 may reach must not wait 30 s and fail:
    the waiting checkpoint makes lane 1 keep its in-flight batches instead."""
    hub = make_hub(lanes=2)
    hub.open(0, "c", 0)
    produced = settled(hub)
    for _ in range(10):  # consume lane 0 until lane 1 holds the producer back
        if hub.stats()["producer_waiting_on"] == 1:
            break
        hub.ack(0, "c", produced[0])
        produced = settled(hub)
    assert waiting_on(hub, 1)
    position = produced[0] + MAX_AHEAD
    hub.ack(0, "c", produced[0])
    started = time.monotonic()
    _, _, state = hub.checkpoint({0: position}, produce_timeout=20)
    assert time.monotonic() - started < 10
    assert state.positions()[0] == position


@pytest.fixture(scope="module")
def small_specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("backpressure-corpus")
    write_sample_corpus(root, docs_per_dataset=120, seed=3, mean_words=20)
    return sample_corpus_specs(root)


@pytest.mark.timeout(120)
def test_a_source_far_ahead_keeps_the_cache_epochs_of_the_slowest_consumer(small_specs, tmp_path):
    """The consumer acknowledged 3 batches while the source ran many epochs (one chunk
    each) ahead: a checkpoint there resumes from the replay cache (every replayed document a
    hit), although the cache keeps one epoch."""
    pipe = Pipeline(small_specs, seed=7, lanes=1, chunk_size=4, flush_every_k_chunks=1)
    pipe.decode_text().tokenize(tokenizer="byte").pack_flat(max_length=64)
    pipe.shuffle(buffer_size=4).batch(microbatch_size=2)
    cache = ReplayCache(tmp_path / "cache", keep_epochs=1)
    hub = LaneHub(pipe, ExecutionConfig(runner="inline"), max_ahead=60, replay_cache=cache)
    hub.start()
    try:
        reader = hub.open(0, "c", 0)
        first = [next(reader) for _ in range(3)]
        hub.ack(0, "c", 3)
        settled(hub)
        _, _, state = hub.checkpoint()
        assert state.positions() == {0: 3}
        boundary = state.lanes[0].boundary_chunk
        produced_chunk = hub.run.logs[0].history[-1][1][0]
        assert produced_chunk >= boundary + 5, "the source did not run epochs ahead"
    finally:
        hub.stop()
    state = ResumeState.decode(state.encode())
    run = pipe.run(ExecutionConfig(runner="inline"), resume=state, replay_cache=cache)
    batches = run.batches()
    nxt = next(batches)
    assert nxt.seq == 3 and first[-1].chain_digest == state.lanes[0].chain
    replayed_docs = (state.lanes[0].replay_cursor[0] - boundary + 1) * 4
    assert run.replay_cache.hits == replayed_docs
    run.close()


@pytest.fixture(scope="module")
def huge_document(tmp_path_factory):
    """One dataset of one 2 MB document: packed into 32,768 rows of 64 tokens."""
    import json

    from zephon_server.engine.datasets import DatasetSpec

    root = tmp_path_factory.mktemp("huge")
    (root / "doc.jsonl").write_text(json.dumps({"text": "abcd" * (1 << 19)}) + "\n")
    return [DatasetSpec("huge", str(root / "doc.jsonl"), 1.0)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_a_huge_documents_first_batch_comes_before_its_other_rows_are_built(
    huge_document, runner, monkeypatch
):
    """``pack_flat`` plans all 32,768 rows of the document at once, but the rows are built
    (and batched) a micro-batch at a time as the consumer pulls: when the first batch comes
    out, only a few micro-batches exist (the queues' depth), not the whole document."""
    from zephon_server.engine.ops.pack import PackFlat

    built = {"rows": 0}
    original = PackFlat.process_many

    def counting(self, elems):
        built["rows"] += len(elems)
        return original(self, elems)

    monkeypatch.setattr(PackFlat, "process_many", counting)
    pipe = Pipeline(huge_document, lanes=1, chunk_size=1, flush_every_k_chunks=1)
    pipe.decode_text().tokenize(tokenizer="byte").pack_flat(max_length=64).batch(microbatch_size=4)
    run = pipe.run(ExecutionConfig(runner=runner, workers=2))
    batches = run.batches()
    first = next(batches)
    time.sleep(1.0)  # the threads runner fills its bounded queues meanwhile
    assert first.seq == 0
    assert 0 < built["rows"] <= 16 * 64, built  # micro-batches of 64 rows
    run.close()
