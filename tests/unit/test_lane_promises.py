"""Lane promises (engine/lane_promises.py): a lower bound of each lane's batch count from the
records that entered the plan's conserving tail, which lets ``end_of_data: shortest`` release
a seq before every lane has produced it.

The bound must never exceed what a lane produces (a batch would go out past the common end),
and with ``drop_last`` it must reach it exactly (every record counted). Real runs check both
on several tails, runners and a resume; the frontier's use of it is pinned on synthetic
batches.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from tests.support.builders import slow_first_batch_pipeline
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.lane_ends import DELIVER, WAIT, LaneEnds
from zephon_server.engine.lane_promises import LanePromises, counting_step
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.records import SampleMeta, SampleRecord
from zephon_server.engine.run import PipelineRun

ZERO = bytes(32)


def pipeline(specs, tail, *, drop_last=True, mapped=False, end="longest") -> Pipeline:
    """decode, tokenize, pack_flat, ``tail`` (a list of (op, params)), batch of 3."""
    pipe = Pipeline(specs, seed=5, lanes=4, chunk_size=16, flush_every_k_chunks=2, end_of_data=end)
    pipe.decode_text().tokenize(tokenizer="byte")
    if mapped:  # drops every fifth document before packing: tombstones reach the tail
        pipe.map_transform(fn=lambda p: None if len(p["input_ids"]) % 5 == 0 else p)
    pipe.pack_flat(max_length=96)
    for name, params in tail:
        pipe.add(name, **params)
    return pipe.batch(microbatch_size=3, drop_last=drop_last)


def promised_and_produced(run) -> tuple[dict[int, int], dict[int, int]]:
    """Consume ``run``; the largest promise and the end (next seq) of every lane."""
    promised: dict[int, int] = {}
    lock = threading.Lock()

    def record(lane: int, batches: int) -> None:
        with lock:
            assert batches > promised.get(lane, -1)  # promises only grow
            promised[lane] = batches

    run.on_promise = record
    produced = {lane: log.start.next_seq for lane, log in run.logs.items()}
    for item in run:
        if isinstance(item, NumberedBatch):
            produced[item.lane_id] = item.seq + 1
    return promised, produced


TAILS = {
    "shuffle": [("shuffle", {"buffer_size": 8})],
    "block_warmup": [
        ("shuffle", {"buffer_size": 8, "algorithm": "block_warmup", "warmup_size": 2})
    ],
    "mixture+shuffle": [("ensure_mixture", {"buffer_size": 16}), ("shuffle", {"buffer_size": 8})],
}


@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("mapped", [False, True])
def test_with_drop_last_every_lane_is_promised_exactly_what_it_produces(corpus_specs, tail, mapped):
    run = pipeline(corpus_specs, TAILS[tail], mapped=mapped).run(ExecutionConfig(runner="inline"))
    promised, produced = promised_and_produced(run)
    assert promised == produced and min(produced.values()) > 1


def test_without_drop_last_the_promise_stays_below_the_partial_batches(corpus_specs):
    pipe = pipeline(corpus_specs, TAILS["shuffle"], drop_last=False)
    promised, produced = promised_and_produced(pipe.run(ExecutionConfig(runner="inline")))
    assert promised.keys() == produced.keys()
    assert all(0 < promised[lane] <= produced[lane] for lane in produced)
    assert promised != produced  # the partial batches at sentinels come on top


@pytest.mark.parametrize("workers", [1, 3])
def test_threads_count_what_inline_counts(corpus_specs, workers):
    pipe = pipeline(corpus_specs, TAILS["mixture+shuffle"])
    inline = promised_and_produced(pipe.run(ExecutionConfig(runner="inline")))
    threads = promised_and_produced(pipe.run(ExecutionConfig(runner="threads", workers=workers)))
    assert threads == inline


def test_a_resumed_lane_is_not_promised_anything(corpus_specs):
    # Its replay filter drops the records before the cursor: counting them would overshoot.
    pipe = pipeline(corpus_specs, TAILS["shuffle"])
    run = pipe.run(ExecutionConfig(runner="inline"))
    list(run)
    checkpoint = run.checkpoint({0: 0, 1: 3, 2: 5, 3: 0})
    resumed = pipe.run(ExecutionConfig(runner="inline"), resume=checkpoint)
    promised, produced = promised_and_produced(resumed)
    assert sorted(promised) == [0, 3]  # the lanes at their start: no replay cursor
    assert all(promised[lane] == produced[lane] for lane in promised)


def steps_of(specs, tail, extra=()):
    pipe = pipeline(specs, tail)
    plan = pipe.plan(ExecutionConfig(runner="inline"))
    steps = [step.ops for stage in plan.stages for step in stage.steps]
    return [*steps[:-1], *extra, steps[-1]] if extra else steps


def test_records_are_counted_where_the_conserving_tail_starts(corpus_specs):
    steps = steps_of(corpus_specs, TAILS["mixture+shuffle"])
    names = ["+".join(op.op_name for op in ops) for ops in steps]
    index, batch_size = counting_step(steps)
    assert names[index:] == ["ensure_mixture", "shuffle", "replay_filter", "batch"]
    assert batch_size == 3
    # nothing before the batch but the replay filter: a batch is out when it is promised
    assert counting_step(steps_of(corpus_specs, [])) is None
    # a map between the shuffle and the batch may drop records: nothing is promised
    mapper = pipeline(corpus_specs, [], mapped=True).plan(ExecutionConfig()).ops[2]
    assert counting_step(steps_of(corpus_specs, TAILS["shuffle"], extra=[[mapper]])) is None


def test_tombstones_and_resumed_lanes_are_not_counted():
    seen = []
    promises = LanePromises(2, {0: 5, 1: 0}, lambda lane, n: seen.append((lane, n)))
    meta = SampleMeta(0, (0, 0), 0, None, ())
    records = [SampleRecord({}, meta), SampleRecord(None, meta.as_tombstone("filtered"))]
    records.append(SampleRecord({}, SampleMeta(2, (0, 0), 0, None, ())))  # lane 2: resumed
    promises.count(records)
    assert seen == [] and promises.promised == {0: 5, 1: 0}
    promises.count(records[:1])
    assert seen == [(0, 6)]


def batch(lane: int, seq: int) -> NumberedBatch:
    from zephon_server.engine.records import SampleBatch

    b = SampleBatch(lane, {}, (SampleMeta(lane, (seq, 0), 0, None, ()),))
    return NumberedBatch.number(b, seq, ZERO)


def test_the_frontier_passes_a_seq_every_lane_is_promised():
    ends = LaneEnds("shortest", {lane: (0, ZERO) for lane in range(3)})
    ends.add(batch(0, 0))
    assert ends.status(0) == WAIT and ends.lagging(0) == [1, 2]
    ends.promise(1, 2)
    ends.promise(2, 1)
    assert ends.status(0) == DELIVER and ends.status(1) == WAIT and ends.lagging(1) == [0, 2]
    # a promise never makes the end final: that needs the batches themselves
    ends.finish(0, 1, [])
    assert ends.end is None and ends.lagging(1) == [1, 2]
    with pytest.raises(RuntimeError, match="promised 2 batches"):
        ends.finish(1, 1, [])


class OpenGate:
    """A server's gate that never holds a lane back."""

    closed = False

    def ready(self, lane: int) -> bool:
        return True

    def wait(self, timeout: float) -> None:
        raise AssertionError("an open gate never waits")


def test_seq_0_goes_out_before_every_lane_has_produced_a_batch(larger_specs):
    # As in a server (a gate, the end applied on the readers' side): the lanes are fed round
    # robin, and the frontier passes seq 0 once each lane's first chunk promises a batch,
    # while a lane's first batch waits for its shuffle buffer to fill (several chunks).
    pipe = slow_first_batch_pipeline(larger_specs)
    run = PipelineRun(pipe.plan(ExecutionConfig(runner="inline")), gate=OpenGate(), apply_end=False)
    ends = LaneEnds("shortest", {lane: (0, ZERO) for lane in run.lanes})
    run.on_promise = ends.promise
    produced: Counter = Counter()
    for item in run:
        if isinstance(item, NumberedBatch):
            ends.add(item)
            produced[item.lane_id] += 1
            if ends.status(0) == DELIVER:
                break
    run.close()
    assert ends.status(0) == DELIVER
    assert produced == {0: 1}  # without promises, seq 0 would wait for lanes 1-3's batches
