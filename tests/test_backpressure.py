"""The hub's memory bound: its producer waits while a lane's log is full.

A lane's log holds at most ``--max-ahead + headroom`` unconsumed batches: the gate stops
feeding a lane at ``--max-ahead``, and the producer waits before adding more, whatever the
chunks already in flight still make (here one chunk makes 30 batches, the bound is 10). It
goes on when an ack or a closing consumer makes room, when another lane needs a batch (a
checkpoint waiting for a position, a reader), and stops at once on stop or resume. The
replay cache keeps the epochs a checkpoint at the slowest consumer's position needs, however
far the source runs ahead.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from helpers import lane_chains
from zephon_server.delivery.hub import LaneHub, headroom
from zephon_server.engine.checkpoint import ResumeState
from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.replay_cache import ReplayCache

MAX_AHEAD = 2
LIMIT = MAX_AHEAD + headroom(MAX_AHEAD)  # 10
CHUNK = 30  # documents per chunk: one batch each, so one chunk makes 30 batches


def one_batch_per_document(specs, *, lanes: int) -> Pipeline:
    pipe = Pipeline(specs, lanes=lanes, chunk_size=CHUNK, flush_every_k_chunks=2)
    return pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=1)


@pytest.fixture
def make_hub(corpus_specs):
    hubs: list[LaneHub] = []

    def make(lanes: int = 1, runner: str = "inline", **kwargs) -> LaneHub:
        hub = LaneHub(
            one_batch_per_document(corpus_specs, lanes=lanes),
            ExecutionConfig(runner=runner, workers=2),
            max_ahead=MAX_AHEAD,
            **kwargs,
        )
        hub.start()
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        hub.stop()


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


@pytest.mark.timeout(60)
def test_a_reader_waiting_on_one_lane_is_not_stuck_behind_another_full_lane(make_hub):
    """The same for a reader: lane 0's reader gets its next batch although lane 1 (never
    read) is full, and lane 1 then holds at most the hub's cap."""
    hub = make_hub(lanes=2, runner="threads")
    reader = hub.open(0, "c", 0)
    got = 0
    deadline = time.monotonic() + 30
    while got < 3 * CHUNK and time.monotonic() < deadline:
        item = next(reader)
        assert isinstance(item, NumberedBatch) and item.seq == got
        got += 1
        hub.ack(0, "c", got)
    assert got == 3 * CHUNK
    assert hub.stats()["lanes"][1]["unconsumed"] <= hub.cap


def repeating(specs):
    return [dataclasses.replace(spec, exhaustion="repeat") for spec in specs]


@pytest.mark.timeout(120)
def test_past_the_cap_batches_are_not_kept_and_their_readers_replay_them(corpus_specs):
    """One chunk makes 600 batches of lane 1, which nobody reads, while lane 0's reader waits
    for the chunk behind it: lane 1 keeps up to the hub's cap, the rest is not kept. A reader
    of lane 1 then gets every batch, identical to an in-process run: the kept ones from the
    log, the others from one replay."""
    pipe = Pipeline(repeating(corpus_specs), lanes=2, chunk_size=600, flush_every_k_chunks=2)
    pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=1)
    reference = lane_chains(pipe.run(ExecutionConfig(runner="inline")), limit=700)
    hub = LaneHub(pipe, ExecutionConfig(runner="threads", workers=2), max_ahead=MAX_AHEAD)
    hub.start()
    try:
        zero = hub.open(0, "zero", 0)
        # Lane 0's first chunk and into a later one, until lane 1's chunk has gone past the
        # cap (fresh lanes are fed first until their first batch, so lane 0 may get more than
        # one chunk before lane 1 gets any: the order lanes are fed in is not the point here).
        for seq in range(4 * 600):
            item = next(zero)
            assert isinstance(item, NumberedBatch) and item.seq == seq
            hub.ack(0, "zero", seq + 1)
            if seq >= 610 and seq % 50 == 0 and hub.stats()["lanes"][1]["not_kept"] > 0:
                break
        hub.close_consumer(0, "zero")
        lane1 = hub.stats()["lanes"][1]
        assert lane1["not_kept"] > 0 and lane1["buffered"] == hub.cap, lane1
        assert hub.replays_started == 0
        one = hub.open(1, "one", 0)
        got = []
        for seq in range(650):
            item = next(one)
            assert isinstance(item, NumberedBatch)
            got.append((item.seq, item.chain_digest.hex()))
            hub.ack(1, "one", seq + 1)
        assert got == reference[1][:650]
        assert hub.replays_started == 1
    finally:
        hub.stop()


# --------------------------------------------------------------------------------------------
# The replay cache keeps what a checkpoint at the slowest consumer's position needs
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# In-driver steps hand a huge document's output on piece by piece
# --------------------------------------------------------------------------------------------


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
