"""ByteLRU: the shard cache's byte-budgeted LRU."""

from __future__ import annotations

import logging

import pytest

from zephon_server.engine.byte_lru import ByteLRU


def test_least_recently_used_values_go_first_to_make_room() -> None:
    lru = ByteLRU(max_bytes=10)
    lru.put("a", "A", 4)
    lru.put("b", "B", 4)
    assert lru.get("a") == "A"  # a is now the most recent
    lru.put("c", "C", 4)  # 12 > 10: b goes, not a
    assert lru.look("b") is None and lru.look("a") == "A" and lru.look("c") == "C"
    assert (lru.bytes_cached, lru.evictions, lru.hits, len(lru)) == (8, 1, 1, 2)


def test_look_neither_refreshes_nor_counts() -> None:
    lru = ByteLRU(max_bytes=8)
    lru.put("a", "A", 4)
    lru.put("b", "B", 4)
    assert lru.look("a") == "A"
    lru.put("c", "C", 4)  # a was not refreshed by look: it goes
    assert lru.look("a") is None and lru.hits == 0


def test_replacing_a_key_counts_its_bytes_once() -> None:
    lru = ByteLRU(max_bytes=10)
    lru.put("a", "A", 6)
    lru.put("a", "A2", 7)
    assert (lru.get("a"), lru.bytes_cached, lru.evictions) == ("A2", 7, 0)


def test_a_value_over_the_whole_budget_is_not_kept_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lru = ByteLRU(max_bytes=10)
    lru.put("small", "s", 3)
    with caplog.at_level(logging.WARNING):
        lru.put("big", "B", 11)
        lru.put("big", "B", 11)
    assert lru.look("big") is None and lru.look("small") == "s"
    assert lru.bytes_cached == 3
    assert sum("more than the whole budget" in r.message for r in caplog.records) == 1


def test_drop_and_clear_give_the_bytes_back() -> None:
    lru = ByteLRU(max_bytes=10)
    lru.put("a", "A", 4)
    lru.put("b", "B", 5)
    lru.drop("a")
    lru.drop("missing")
    assert lru.bytes_cached == 5
    lru.clear()
    assert (lru.bytes_cached, len(lru), lru.look("b")) == (0, 0, None)
