"""Reorder buffer: dispatch order in deterministic mode, completion order otherwise."""

from __future__ import annotations

import random
import threading

import pytest

from zephon_server.engine.reorder import ReorderBuffer, ReorderBufferClosed


def test_releases_in_sequence_order_whatever_the_completion_order():
    rb = ReorderBuffer(capacity=64)
    seqs = [rb.reserve() for _ in range(20)]
    order = seqs[:]
    random.Random(3).shuffle(order)
    for s in order:
        rb.complete(s, [s])
    got = [item[0] for _ in range(20) for _, item in [rb.pop(timeout=1)]]
    assert got == list(range(20))


def test_holds_back_until_the_head_completes():
    rb = ReorderBuffer(capacity=8)
    a, b = rb.reserve(), rb.reserve()
    rb.complete(b, ["b"])
    assert rb.depth == 1
    with pytest.raises(TimeoutError):
        rb.pop(timeout=0.05)
    rb.complete(a, ["a"])
    assert [x for _, x in rb.pop_many(timeout=1)] == [["a"], ["b"]]


def test_non_deterministic_mode_releases_in_completion_order_but_not_past_controls():
    rb = ReorderBuffer(capacity=8, ordered=False)
    a, b, c, d = (rb.reserve() for _ in range(4))
    rb.complete(c, "sentinel", control=True)
    rb.complete(d, ["d"])  # after the control: must wait for it
    rb.complete(b, ["b"])
    assert rb.pop(timeout=1) == (False, ["b"])
    with pytest.raises(TimeoutError):
        rb.pop(timeout=0.05)  # a is still in flight; c may not pass it
    rb.complete(a, ["a"])
    assert rb.pop(timeout=1) == (False, ["a"])
    assert rb.pop(timeout=1) == (True, "sentinel")
    assert rb.pop(timeout=1) == (False, ["d"])


def test_capacity_blocks_reserve_until_release():
    rb = ReorderBuffer(capacity=2)
    s0, _ = rb.reserve(), rb.reserve()
    reserved = threading.Event()

    def third():
        rb.reserve()
        reserved.set()

    threading.Thread(target=third, daemon=True).start()
    assert not reserved.wait(0.1)
    rb.complete(s0, [0])
    rb.pop(timeout=1)
    assert reserved.wait(1)


def test_failure_is_raised_in_its_turn_and_close_wakes_waiters():
    rb = ReorderBuffer(capacity=4)
    a, b = rb.reserve(), rb.reserve()
    rb.fail(b, RuntimeError("boom"))
    rb.complete(a, ["a"])
    assert rb.pop_many(timeout=1) == [(False, ["a"])]
    with pytest.raises(RuntimeError, match="boom"):
        rb.pop(timeout=1)
    rb.close()
    with pytest.raises(ReorderBufferClosed):
        rb.pop(timeout=1)
