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
