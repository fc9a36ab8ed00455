"""LaneHub readers and the message planner: the batches a BatchGroup carries.

A reader's batches are the same whether taken one by one or several at a time: ``poll``
takes only a batch already produced, ``linger`` waits for more; the planner groups the ones
that are produced, consecutive from the reader's position, within the count the consumer
takes, the byte budget and the send window, and leaves the rest to the next message.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.builders import slow_first_batch_pipeline
from zephon_server.delivery.acks import AckWindow
from zephon_server.delivery.hub import EndOfLane, LaneHub
from zephon_server.delivery.message_planner import Batches, Ended, MessagePlanner, MessagePolicy
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline


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


def test_poll_takes_produced_batches_in_order(hub):
    whole = [b for b in hub.open(0, "one-by-one", 0) if not isinstance(b, EndOfLane)]
    reader = hub.open(0, "polled", 0)
    taken = [next(reader), *(reader.poll() for _ in range(3))]
    assert seqs(taken) == [0, 1, 2, 3]
    rest = [b for b in reader if not isinstance(b, EndOfLane)]
    assert [b.chain_digest for b in [*taken, *rest]] == [b.chain_digest for b in whole]


def test_poll_never_waits_for_batches_not_produced(hub):
    total = len([b for b in hub.open(1, "all", 0) if not isinstance(b, EndOfLane)])
    reader = hub.open(1, "polled", 0)
    started = time.monotonic()
    got = list(iter(reader.poll, None))
    assert seqs(got) == list(range(total))  # everything produced, then it stops
    assert time.monotonic() - started < 1.0
    assert isinstance(next(reader), EndOfLane)


def test_a_stopped_hub_has_nothing_to_poll(hub):
    reader = hub.open(0, "c", 0)
    hub.stop()
    assert reader.poll() is None


def planner(hub, lane, *, per_message, window=100, group_max_bytes=16 << 20, linger=0.0):
    reader = hub.open(lane, f"planned-{per_message}-{window}", 0)
    policy = MessagePolicy(window, linger, 0, group_max_bytes=group_max_bytes)
    acks = AckWindow(0)
    draining = threading.Event()
    return MessagePlanner(
        reader,
        acks,
        policy,
        lane=lane,
        per_message=per_message,
        shared_memory=False,
        draining=draining,
    )


def test_messages_group_produced_batches_within_count_and_bytes(hub):
    """The planner takes only batches already produced, consecutive, within the count the
    consumer takes and the byte budget; the batch that does not fit starts the next message."""
    whole = [b for b in hub.open(0, "one-by-one", 0) if not isinstance(b, EndOfLane)]
    budget = whole[4].nbytes + whole[5].nbytes
    plan = planner(hub, 0, per_message=4, group_max_bytes=budget)
    groups = []
    for message in plan.messages(lambda: True):
        if isinstance(message, Ended):
            break
        assert isinstance(message, Batches) and message.ring_offsets is None
        groups.append(list(message.batches))
    assert [b.chain_digest for g in groups for b in g] == [b.chain_digest for b in whole]
    for group in groups:
        assert len(group) <= 4
        assert len(group) == 1 or sum(b.nbytes for b in group) <= budget
    assert max(len(g) for g in groups) > 1


def test_a_batch_past_the_byte_budget_starts_the_next_message(hub):
    whole = [b for b in hub.open(1, "one-by-one", 0) if not isinstance(b, EndOfLane)]
    plan = planner(hub, 1, per_message=8, group_max_bytes=1)  # no second batch ever fits
    got = []
    for message in plan.messages(lambda: True):
        if isinstance(message, Ended):
            break
        assert isinstance(message, Batches) and len(message.batches) == 1
        got += message.batches
    assert [b.chain_digest for b in got] == [b.chain_digest for b in whole]


def test_messages_never_pass_the_send_window(hub):
    """Without acknowledgements a stream sends ``window`` batches, then waits."""
    plan = planner(hub, 1, per_message=4, window=5)
    stop = time.monotonic() + 1.0
    sent = []
    for message in plan.messages(lambda: time.monotonic() < stop):
        assert isinstance(message, Batches)
        sent += seqs(message.batches)
    assert sent == [0, 1, 2, 3, 4]
    assert plan.acks.sent == 5


@pytest.fixture
def gated_hub(corpus_specs):
    """A hub that may run only 2 batches ahead of its slowest consumer (threads x2). Every
    lane to its own end: a reader waiting at the common end of a finite stream would count as
    demand for the other lane and keep the producer going (end_of_data: shortest)."""
    pipe = Pipeline(
        corpus_specs, lanes=2, chunk_size=5, flush_every_k_chunks=1, end_of_data="longest"
    )
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
    """``linger(n, ...)`` returns as soon as n batches exist: here the last two appear
    only after an ack lets the gated producer on, well before the linger runs out."""
    reader = gated_hub.open(0, "c", 0)
    produced = stalled(gated_hub, 0)
    first = next(reader)
    threading.Timer(0.2, gated_hub.ack, (0, "c", produced)).start()
    started = time.monotonic()
    reader.linger(produced + 1, 30.0)
    waited = time.monotonic() - started
    got = [reader.poll() for _ in range(produced + 1)]
    assert seqs([first, *got]) == list(range(produced + 2))
    assert 0.15 < waited < 20, waited  # it waited for the ack, not for the whole linger


def test_linger_gives_up_at_its_deadline_with_what_is_ready(gated_hub):
    reader = gated_hub.open(1, "c", 0)
    produced = stalled(gated_hub, 1)
    next(reader)
    started = time.monotonic()
    reader.linger(produced + 3, 0.3)
    waited = time.monotonic() - started
    got = list(iter(reader.poll, None))
    assert seqs(got) == list(range(1, produced))
    assert 0.25 < waited < 5, waited
    started = time.monotonic()
    reader.linger(5, 0.0)  # without a linger it never waits
    assert reader.poll() is None and time.monotonic() - started < 0.2


def test_linger_stops_at_the_lane_end(hub):
    total = len([b for b in hub.open(1, "all", 0) if not isinstance(b, EndOfLane)])
    reader = hub.open(1, "grouped", 0)
    started = time.monotonic()
    reader.linger(total + 10, 30.0)
    assert time.monotonic() - started < 5
    got = list(iter(reader.poll, None))
    assert seqs(got) == list(range(total))
    assert isinstance(next(reader), EndOfLane)


def test_linger_stops_when_the_consumer_closes(gated_hub):
    reader = gated_hub.open(0, "c", 0)
    produced = stalled(gated_hub, 0)
    next(reader)
    threading.Timer(0.2, gated_hub.close_consumer, (0, "c")).start()
    started = time.monotonic()
    reader.linger(produced + 3, 30.0)
    assert 0.15 < time.monotonic() - started < 10


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_a_common_end_lets_seq_0_out_on_promises_and_the_lanes_stay_the_oracles(
    larger_specs, runner
):
    """``end_of_data: shortest``: the hub hands the lanes' promised batch counts
    (engine/lane_promises.py) to its frontier, so seq 0 does not wait for every lane's first
    batch (each needs about three chunks to fill its shuffle); what the readers get is still
    the inline run's lanes, cut at the same end."""
    pipe = slow_first_batch_pipeline(larger_specs)
    expected: dict[int, list[bytes]] = {lane: [] for lane in range(4)}
    for batch in pipe.run(ExecutionConfig(runner="inline")).batches():
        expected[batch.lane_id].append(batch.chain_digest)
    workers = 1 if runner == "inline" else 2
    hub = LaneHub(pipe, ExecutionConfig(runner=runner, workers=workers), max_ahead=1000)
    hub.start()
    try:
        readers = {lane: hub.open(lane, "r", 0) for lane in range(4)}
        first = next(readers[0])
        assert isinstance(first, NumberedBatch) and first.seq == 0
        promised = hub.end_gate.ends.promises()
        assert all(n >= 1 for n in promised.values()), promised  # the frontier got them
        got: dict[int, list[bytes]] = {0: [first.chain_digest], 1: [], 2: [], 3: []}
        for lane, reader in readers.items():
            for item in reader:
                if isinstance(item, EndOfLane):
                    break
                got[lane].append(item.chain_digest)
        assert got == expected
    finally:
        hub.stop()


def test_the_default_replay_limit_is_one_per_served_lane(corpus_specs):
    # One trainer resumed far back on all 8 lanes needs 8 replays at once: with a fixed 4 the
    # fifth lane was refused on every attempt (its own replays never end while it waits).
    pipe = Pipeline(corpus_specs, lanes=8, chunk_size=5)
    pipe.decode_text().tokenize().batch(microbatch_size=3)
    execution = ExecutionConfig(runner="inline")
    assert LaneHub(pipe, execution).max_replays == 8
    assert LaneHub(pipe, execution, lanes=[0, 1]).max_replays == 4  # at least 4
    assert LaneHub(pipe, execution, max_replays=2).max_replays == 2  # --max-replays wins
    assert LaneHub(pipe, execution, max_replays=0).max_replays == 0
