"""Flush sentinels: per-lane flushes, batch(drop_last=True) stalls, contract enforcement: the tests
that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_stalling.py``.
"""

from __future__ import annotations

import pytest

from tests.support.builders import make_pipeline
from tests.unit.test_stalling import cross_epoch_batches
from zephon_server.engine.execution import ExecutionConfig


@pytest.mark.parametrize("runner", ["inline", "threads", "processes"])
def test_live_cross_epoch_batch_appears_and_matches_inline(corpus_specs, runner):
    # 5 records per chunk, a sentinel after every chunk, batches of 3: a lane's epoch ends
    # with 2 records pending, so the batch stalls and emits [old, old, new].
    def batches(ex):
        pipe = make_pipeline(corpus_specs, chunk_size=5, k=1).batch(microbatch_size=3)
        return list(pipe.run(ex).batches())

    want = batches(ExecutionConfig(runner="inline"))
    mixed = cross_epoch_batches(want, 1)
    assert mixed, "expected live cross-epoch batches"
    assert [m.chunk_id for m in mixed[0].rows] == [0, 0, 1]
    got = batches(ExecutionConfig(runner=runner, workers=2))
    assert [(b.lane_id, b.seq, b.chain_digest) for b in got] == [
        (b.lane_id, b.seq, b.chain_digest) for b in want
    ]
