"""Exact resume: restore at every step, stalls and cross-epoch batches, elastic ranks: the tests
that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_resume.py``.
"""

from __future__ import annotations

import pytest

from tests.unit.test_resume import (
    per_lane,
    stateful,
)
from zephon_server.engine.execution import ExecutionConfig


@pytest.mark.processes
def test_restore_with_processes_runner(small_specs):
    pipe = stateful(small_specs, "block")
    full_run = pipe.run(ExecutionConfig(runner="inline"))
    full = per_lane(full_run)
    for cut in (1, 5):
        state = full_run.checkpoint({lane: cut for lane in full})
        resumed = per_lane(pipe.run(ExecutionConfig(runner="processes", workers=2), resume=state))
        assert resumed == {lane: v[cut:] for lane, v in full.items()}
