"""The replay cache: a resume reads cached token ids instead of tokenizing, same data: the tests
that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_replay_cache.py``.
"""

from __future__ import annotations

import pytest

from tests.unit.test_replay_cache import (
    chains,
    checkpoint_mid_epoch,
    pipeline,
)
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.replay_cache import ReplayCache


@pytest.mark.processes
def test_resume_with_cache_on_processes_runner(specs, tmp_path):
    pipe = pipeline(specs)
    full = chains(pipe.run(ExecutionConfig(runner="inline")))
    for cut in (5, 13):
        cache = ReplayCache(tmp_path / f"cut{cut}")
        state = checkpoint_mid_epoch(pipe, cache, cut)
        run = pipe.run(
            ExecutionConfig(runner="processes", workers=2), resume=state, replay_cache=cache
        )
        assert chains(run) == {lane: v[cut:] for lane, v in full.items()}
