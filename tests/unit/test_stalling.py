"""Flush sentinels: per-lane flushes, batch(drop_last=True) stalls, contract enforcement."""

from __future__ import annotations

import pytest

from tests.support.builders import make_pipeline, rec
from zephon_server.engine.errors import ContractError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.accumulators import CountingAccumulator
from zephon_server.engine.ops.base import Operator, OpTraits
from zephon_server.engine.ops.batch import Batch
from zephon_server.engine.records import FlushSentinel
from zephon_server.engine.runners.steps import Step, StepDriver, Task


def cross_epoch_batches(batches, k):
    return [b for b in batches if len({m.chunk_id // k for m in b.rows}) > 1]


def test_drop_last_false_emits_partial_batch_at_sentinel(corpus_specs):
    pipe = make_pipeline(corpus_specs, chunk_size=5, k=1).batch(microbatch_size=3, drop_last=False)
    batches = list(pipe.run(ExecutionConfig(runner="inline")).batches())
    assert cross_epoch_batches(batches, 1) == []
    assert any(len(b.rows) == 2 for b in batches)


def driver_for(op):
    from zephon_server.engine.ops.base import OpContext

    ctx = OpContext(op_name=op.op_name, op_index=0, lanes=2, seed=0)
    op.setup(ctx)
    return StepDriver(Step([op], 0), op.accumulator(deterministic=True, ctx=ctx))


def test_stalled_lane_does_not_hold_back_another_lanes_sentinel():
    driver = driver_for(Batch(microbatch_size=3))
    out = driver.feed([rec(0, 0, 0), rec(0, 0, 1), rec(1, 0, 0), rec(1, 0, 1), rec(1, 0, 2)])
    assert [type(x) for x in out] == [Task]  # lane 1's full batch
    out = driver.feed([FlushSentinel(0, 1), FlushSentinel(1, 1)])
    assert out == [FlushSentinel(1, 1)]  # lane 1 had nothing pending: released at once
    assert driver.stalled_lanes == 1 and driver.sentinels_stalled_total == 1
    out = driver.feed([rec(0, 1, 0)])  # completes [old, old, new] on lane 0
    assert [type(x) for x in out] == [Task, FlushSentinel]
    assert [e.meta.cursor for e in out[0].elems] == [(0, 0), (0, 1), (1, 0)]
    assert driver.stalled_lanes == 0


def test_stalled_sentinel_waits_until_pre_boundary_records_leave():
    driver = driver_for(Batch(microbatch_size=2))
    driver.feed([rec(0, 0, 0), FlushSentinel(0, 1)])
    # The next batch [old, new] takes the last old record: release right after it.
    out = driver.feed([rec(0, 1, 0), rec(0, 1, 1)])
    assert [type(x) for x in out] == [Task, FlushSentinel]


class Leaky(Operator):
    """A custom operator whose accumulator ignores resets (a contract violation)."""

    op_name = "leaky"

    def traits(self):
        return OpTraits(preserves_cursor_order=False, fusable=False)

    def accumulator(self, *, deterministic, ctx):
        class KeepsData(CountingAccumulator):
            def flush(self, *, reset=False, lane_id=None):
                if lane_id is not None:
                    return []  # keeps the lane's buffer: cross-epoch state
                return super().flush(reset=reset, lane_id=lane_id)

        return KeepsData(1000)

    def process_many(self, elems):
        return elems


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_accumulator_keeping_data_after_reset_makes_the_runner_raise(corpus_specs, runner):
    pipe = make_pipeline(corpus_specs).apply(Leaky()).batch(microbatch_size=4)
    with pytest.raises(ContractError, match=r"'leaky'.*still has pending data for lane"):
        list(pipe.run(ExecutionConfig(runner=runner, workers=2)))
