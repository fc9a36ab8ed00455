"""Malformed records follow the dataset's policy: fail naming file and line, or skip+count: the
tests that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_malformed.py``.
"""

from __future__ import annotations

from tests.unit.test_malformed import (
    pipeline,
)
from zephon_server.engine.execution import ExecutionConfig


def lane_ends(run):
    """Per lane: the tombstones after its last batch (what the lane's EndOfStream carries)."""
    for _ in run:
        pass
    return {
        lane: [(m.doc, m.tombstone) for m in log.tail_tombstones]
        for lane, log in sorted(run.logs.items())
    }


def test_documents_closed_after_the_last_batch_are_the_same_on_every_runner(bad_shard):
    # drop_last: a lane's final partial batch is dropped, so its ends carry dropped_last (and
    # malformed) tombstones; every runner must close the same documents in the same order.
    inline = lane_ends(pipeline(bad_shard, "skip", drop_last=True).run(ExecutionConfig("inline")))
    assert any(inline.values())
    assert {t for tail in inline.values() for _, t in tail} >= {"dropped_last"}
    for runner, workers in (("threads", 1), ("threads", 3), ("processes", 2)):
        run = pipeline(bad_shard, "skip", drop_last=True).run(ExecutionConfig(runner, workers))
        assert lane_ends(run) == inline, (runner, workers)
