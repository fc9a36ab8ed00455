"""Execution settings never change the data: runners, workers and micro-batch sizes: the tests that
need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_determinism.py``.
"""

from __future__ import annotations

import time

import pytest

from tests.support.builders import make_pipeline
from tests.unit.test_determinism import (
    batch_pipeline,
    lane_chains,
)
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.base import Operator, OpTraits


@pytest.mark.processes
@pytest.mark.parametrize("workers", [1, 2])
def test_processes_equal_inline(corpus_specs, oracle, workers):
    from zephon_server.engine import shm

    got = lane_chains(
        batch_pipeline(corpus_specs), ExecutionConfig(runner="processes", workers=workers)
    )
    assert got == oracle
    assert shm.live_blocks() == 0


class SlowOnSomeBatches(Operator):
    """Sleeps on micro-batches whose first document has an even row: completions reorder."""

    op_name = "slow"
    default_microbatch_size = 5

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        if elems[0].meta.doc.row % 2 == 0:
            time.sleep(0.01)
        return elems


def test_slow_workers_do_not_change_output(corpus_specs):
    def pipe():
        p = make_pipeline(corpus_specs)
        return p.apply(SlowOnSomeBatches()).batch(microbatch_size=4)

    want = lane_chains(pipe(), ExecutionConfig(runner="inline"))
    got = lane_chains(pipe(), ExecutionConfig(runner="threads", workers=4))
    assert got == want
