"""The replay cache's byte budget: never exceeded, oldest chunks evicted first, a full disk pauses
writing with one warning, the reserve stays free, writers in several processes share one ledger,
and the data never changes (a tiny budget streams and resumes exactly): the tests that break
something on purpose against a real process or file system.

The hermetic tests of the same topic are in ``tests/unit/test_cache_budget.py``.
"""

from __future__ import annotations

import logging

from tests.unit.test_cache_budget import KIB, bound, on_disk, records
from zephon_server.engine.cache_budget import CacheBudget
from zephon_testing.small_fs import free_bytes, tmpfs


def test_a_full_disk_pauses_writing_with_one_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "zephon_server.engine.replay_cache")
    # Out of inodes: the free-space check passes, the write fails with ENOSPC (as when
    # another process takes the last blocks between the check and the write).
    with tmpfs(tmp_path / "small", "1m", "nr_inodes=24") as root:
        budget = CacheBudget(max_bytes=1 << 30, reserve_bytes=0, block=4096)
        cache = bound(root, budget)
        for chunk in range(40):
            cache.store(1, *records(chunk % 2, chunk))  # never raises
        counts = cache.usage()
        assert counts.skipped_disk_full >= 1
        assert counts.bytes == on_disk(cache)
        assert not list(root.rglob("*.tmp"))
        warnings = [r for r in caplog.records if "no space left" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
        assert "not writing it for 30 s" in warnings[0].getMessage()
        # Paused: later entries are counted, not attempted, even with room again.
        cache.evict(0, 1000)
        cache.evict(1, 1000)
        before = cache.stored
        cache.store(1, *records(0, 50))
        assert cache.stored == before
        assert cache.usage().skipped_disk_full == counts.skipped_disk_full + 1
        cache._paused_until = 0.0  # the pause is over
        cache.store(1, *records(0, 51))
        assert cache.stored == before + 4


def test_the_reserve_stays_free_for_checkpoints(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "zephon_server.engine.replay_cache")
    with tmpfs(tmp_path / "small", "256k") as root:
        reserve = 128 * KIB
        cache = bound(root, CacheBudget(max_bytes=1 << 30, reserve_bytes=reserve, block=4096))
        for chunk in range(40):
            cache.store(1, *records(0, chunk))
            assert free_bytes(root) >= reserve, chunk
        assert cache.usage().skipped_low_disk > 0
        assert cache.usage().skipped_disk_full == 0
        lines = [r for r in caplog.records if "kept free for checkpoints" in r.getMessage()]
        assert len(lines) == 1
