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

from tests.support.builders import lane_chains
from zephon_server.delivery.hub import LaneHub
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline

MAX_AHEAD = 2
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
        # Lane 0's first chunk and into later ones, until lane 1's chunk has gone past the
        # cap (fresh lanes are fed first until their first batch, so lane 0 may get more than
        # one chunk before lane 1 gets any, and on a loaded machine lane 1's chunk may come out
        # late: the order lanes are fed in is not the point here, so read on to a deadline).
        deadline = time.monotonic() + 60
        seq = 0
        while time.monotonic() < deadline:
            item = next(zero)
            assert isinstance(item, NumberedBatch) and item.seq == seq
            seq += 1
            hub.ack(0, "zero", seq)
            if seq > 610 and seq % 50 == 0 and hub.stats()["lanes"][1]["not_kept"] > 0:
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
