"""Stateful pipelines (mixture, packing, shuffling) are identical across runners and workers: the
tests that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_stateful_pipeline.py``.
"""

from __future__ import annotations

import pytest

from tests.unit.test_stateful_pipeline import (
    SHUFFLES,
    chains,
    stateful,
)
from zephon_server.engine.execution import ExecutionConfig


@pytest.mark.processes
@pytest.mark.parametrize("algorithm", SHUFFLES)
@pytest.mark.parametrize("workers", [1, 2])
def test_processes_equal_inline(corpus_specs, oracles, algorithm, workers):
    got = chains(
        stateful(corpus_specs, algorithm), ExecutionConfig(runner="processes", workers=workers)
    )
    assert got == oracles[algorithm]
