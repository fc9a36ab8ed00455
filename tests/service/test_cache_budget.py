"""The replay cache's byte budget: never exceeded, oldest chunks evicted first, a full disk pauses
writing with one warning, the reserve stays free, writers in several processes share one ledger,
and the data never changes (a tiny budget streams and resumes exactly): the tests that need a
subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_cache_budget.py``.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from tests.unit.test_cache_budget import FINGERPRINT, KIB, bound, on_disk, records
from zephon_server.engine.cache_budget import LEDGER_NAME, CacheBudget, tree_usage
from zephon_server.engine.replay_cache import ReplayCache
from zephon_testing.small_fs import tmpfs


def _write_many(root: str, lane: int, budget: CacheBudget) -> int:
    cache = ReplayCache(root, budget=budget, fingerprint=FINGERPRINT)
    worst = 0
    for chunk in range(25):
        cache.store(1, *records(lane, chunk))
        worst = max(worst, tree_usage(Path(root), budget, skip=LEDGER_NAME))
    return worst


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_writers_in_several_processes_share_one_budget(tmp_path):
    budget = CacheBudget(max_bytes=80 * KIB, reserve_bytes=0, block=4096)
    cache = bound(tmp_path, budget)  # as a run does before its workers start
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        worst = pool.starmap(_write_many, [(str(tmp_path), lane, budget) for lane in range(3)])
    assert max(worst) <= budget.max_bytes
    assert cache.usage().bytes == on_disk(cache) <= budget.max_bytes
    assert cache.usage().evicted_bytes > 0


def test_the_default_budget_is_a_tenth_of_the_filesystem(tmp_path):
    with tmpfs(tmp_path / "small", "1m") as root:
        budget = CacheBudget.for_path(root / "not-yet" / "replay-cache")
        fs = os.statvfs(root)
        size = fs.f_blocks * fs.f_frsize
        assert budget.max_bytes == size // 10
        assert budget.reserve_bytes == size // 20
        assert budget.block == fs.f_frsize
    with pytest.raises(ValueError, match="max_bytes must be an integer >= 0, got -1"):
        CacheBudget(max_bytes=-1)
