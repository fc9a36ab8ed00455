"""Exact resume: restore at every step, stalls and cross-epoch batches, elastic ranks: the tests
that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_resume.py``.
"""

from __future__ import annotations

import pytest

from tests.unit.test_resume import (
    SHUFFLES,
    per_lane,
    stateful,
)
from zephon_server.engine.checkpoint import ResumeState
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


@pytest.mark.parametrize("algorithm", SHUFFLES)
def test_restore_at_every_step_equals_uninterrupted(small_specs, algorithm):
    pipe = stateful(small_specs, algorithm)
    plan = pipe.plan(ExecutionConfig(runner="inline"))
    from zephon_server.engine.run import PipelineRun

    full_run = PipelineRun(plan)
    full = per_lane(full_run)
    assert all(len(v) >= 4 for v in full.values())
    longest = max(len(v) for v in full.values())
    for cut in range(longest + 1):
        positions = {lane: min(cut, len(v)) for lane, v in full.items()}
        state = ResumeState.decode(full_run.checkpoint(positions).encode())
        for runner in ("inline", "threads"):
            resumed = per_lane(
                PipelineRun(pipe.plan(ExecutionConfig(runner=runner, workers=2)), resume=state)
            )
            for lane, seqs in full.items():
                assert resumed[lane] == seqs[positions[lane] :], (algorithm, cut, runner, lane)
