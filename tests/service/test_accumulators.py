"""Accumulator contracts: per-lane grouping, resets that leave a lane fresh, latency bound: the
tests that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_accumulators.py``.
"""

from __future__ import annotations

import time

from tests.support.builders import cursors, rec
from zephon_server.engine.ops.accumulators import CountingAccumulator


def test_latency_bound_only_when_set():
    acc = CountingAccumulator(100, max_latency_ms=1)
    acc.push_many([rec(0, 0, 0)])
    time.sleep(0.01)
    assert cursors(acc.poll()) == [[(0, 0)]]
    det = CountingAccumulator(100, max_latency_ms=None)
    det.push_many([rec(0, 0, 0)])
    time.sleep(0.01)
    assert det.poll() == []
