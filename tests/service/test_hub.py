"""LaneHub readers: what ``ready`` takes without waiting (the batches a BatchGroup carries).

A reader's batches are the same whether taken one by one or several at a time: ``ready``
takes only batches already produced, consecutive from the reader's position, within the
count and byte budget asked, and leaves the rest to the next read.
"""

from __future__ import annotations

import time

import pytest

from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.hub import EndOfLane, LaneHub, LaneReader
from zephon_server.engine.pipeline import Pipeline


def nbytes(batch) -> int:
    return sum(arr.nbytes for arr in batch.tensors.values())


@pytest.fixture(params=["inline", "threads"])
def hub(request, corpus_specs):
    pipe = Pipeline(corpus_specs, lanes=2, chunk_size=5, flush_every_k_chunks=1)
    pipe.decode_text().tokenize().batch(microbatch_size=3)
    workers = 1 if request.param == "inline" else 2
    hub = LaneHub(pipe, ExecutionConfig(runner=request.param, workers=workers), max_ahead=1000)
    hub.start()
    deadline = time.monotonic() + 60
    while hub.produced().get(0, 0) < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hub.produced()[0] >= 8, "the pipeline did not run ahead"
    yield hub
    hub.stop()


def seqs(items) -> list[int]:
    return [item.seq for item in items]


def test_ready_takes_produced_batches_in_order_within_count_and_bytes(hub):
    whole = [b for b in hub.open(0, "one-by-one", 0) if not isinstance(b, EndOfLane)]
    reader = hub.open(0, "grouped", 0)
    first = next(reader)
    taken = [first, *reader.ready(3)]
    assert seqs(taken) == [0, 1, 2, 3]
    budget = nbytes(whole[4]) + nbytes(whole[5])
    pair = reader.ready(100, max_bytes=budget)
    assert seqs(pair) == [4, 5]  # the 7th would pass the byte budget
    assert reader.ready(5, max_bytes=0) == []  # nothing fits; nothing is skipped
    rest = [b for b in reader if not isinstance(b, EndOfLane)]
    assert [b.chain_digest for b in [*taken, *pair, *rest]] == [b.chain_digest for b in whole]


def test_ready_never_waits_for_batches_not_produced(hub):
    total = len([b for b in hub.open(1, "all", 0) if not isinstance(b, EndOfLane)])
    reader = hub.open(1, "grouped", 0)
    started = time.monotonic()
    got = reader.ready(total + 10)
    assert seqs(got) == list(range(total))  # everything produced, then it stops
    assert time.monotonic() - started < 1.0
    assert isinstance(next(reader), EndOfLane)


def test_a_stopped_hub_or_a_plain_reader_has_nothing_ready(hub):
    reader = hub.open(0, "c", 0)
    hub.stop()
    assert reader.ready(4) == []
    assert LaneReader(iter([])).ready(4) == []


@pytest.fixture
def gated_hub(corpus_specs):
    """A hub that may run only 2 batches ahead of its slowest consumer (threads x2)."""
    pipe = Pipeline(corpus_specs, lanes=2, chunk_size=5, flush_every_k_chunks=1)
    pipe.decode_text().tokenize().batch(microbatch_size=3)
    hub = LaneHub(pipe, ExecutionConfig(runner="threads", workers=2), max_ahead=2)
    hub.start()
    yield hub
    hub.stop()


def stalled(hub, lane: int) -> int:
    """Wait until the gated producer stops (no new batch on ``lane`` for 0.5 s); produced."""
    deadline = time.monotonic() + 60
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = hub.produced().get(lane, 0)
        if now != seen:
            seen, since = now, time.monotonic()
        elif now > 0 and time.monotonic() - since > 0.5:
            return now
        time.sleep(0.02)
    raise AssertionError("the producer never stalled")


def test_linger_waits_for_the_batches_asked_then_returns_them(gated_hub):
    """``ready(n, linger=...)`` returns as soon as n batches exist: here the last two appear
    only after an ack lets the gated producer on, well before the linger runs out."""
    import threading

    reader = gated_hub.open(0, "c", 0)
    produced = stalled(gated_hub, 0)
    first = next(reader)
    threading.Timer(0.2, gated_hub.ack, (0, "c", produced)).start()
    started = time.monotonic()
    got = reader.ready(produced + 1, linger=30.0)
    waited = time.monotonic() - started
    assert seqs([first, *got]) == list(range(produced + 2))
    assert 0.15 < waited < 20, waited  # it waited for the ack, not for the whole linger


def test_linger_gives_up_at_its_deadline_with_what_is_ready(gated_hub):
    reader = gated_hub.open(1, "c", 0)
    produced = stalled(gated_hub, 1)
    next(reader)
    started = time.monotonic()
    got = reader.ready(produced + 3, linger=0.3)
    waited = time.monotonic() - started
    assert seqs(got) == list(range(1, produced))
    assert 0.25 < waited < 5, waited
    assert reader.ready(5, linger=0.0) == []  # without linger it never waits


def test_linger_stops_at_the_lane_end(hub):
    total = len([b for b in hub.open(1, "all", 0) if not isinstance(b, EndOfLane)])
    reader = hub.open(1, "grouped", 0)
    started = time.monotonic()
    got = reader.ready(total + 10, linger=30.0)
    assert seqs(got) == list(range(total))
    assert time.monotonic() - started < 5
    assert isinstance(next(reader), EndOfLane)


def test_linger_stops_when_the_consumer_closes(gated_hub):
    import threading

    reader = gated_hub.open(0, "c", 0)
    produced = stalled(gated_hub, 0)
    next(reader)
    threading.Timer(0.2, gated_hub.close_consumer, (0, "c")).start()
    started = time.monotonic()
    reader.ready(produced + 3, linger=30.0)
    assert 0.15 < time.monotonic() - started < 10
