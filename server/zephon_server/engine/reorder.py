"""The reorder buffer: puts out-of-order completions back into dispatch order.

Each micro-batch gets a monotonically increasing sequence number when dispatched. Workers
complete in any order; the buffer holds results back and releases one only when every
earlier sequence number has gone out. Control items (flush sentinels, lane ends) take a
sequence number too, so they leave exactly between the data dispatched before and after
them. In non-deterministic mode results leave in completion order, but never past a control
item (a sentinel still separates epochs).

``reserve`` blocks while ``capacity`` items are in flight: that is the backpressure that
bounds memory between an operator's accumulator and its workers.
"""

from __future__ import annotations

import threading
from typing import Any


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ReorderBufferClosed(Exception):
    """Raised from blocking calls once the buffer was closed (shutdown)."""


class ReorderBuffer:
    """Thread-safe reorder buffer with bounded in-flight capacity."""

    def __init__(self, capacity: int, *, ordered: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.ordered = ordered
        self._cond = threading.Condition()
        self._next_reserve = 0
        self._next_emit = 0  # ordered mode: next seq to release
        self._done: dict[int, Any] = {}
        self._controls: set[int] = set()
        self._emitted: set[int] = set()  # non-deterministic mode: released seqs above floor
        self._closed = False
        self._stash: tuple[int, Any] | None = None
        self.max_depth = 0

    # -- producer side ------------------------------------------------------------------

    def reserve(self, timeout: float | None = None) -> int:
        """Next sequence number; blocks while ``capacity`` items are in flight."""
        with self._cond:
            while self._next_reserve - self._next_emit - len(self._emitted) >= self.capacity:
                if self._closed:
                    raise ReorderBufferClosed()
                self._cond.wait(timeout)
            if self._closed:
                raise ReorderBufferClosed()
            seq = self._next_reserve
            self._next_reserve += 1
            return seq

    def complete(self, seq: int, items: Any, *, control: bool = False) -> None:
        """Record the result of ``seq`` (a list of elements, or a control item)."""
        with self._cond:
            self._done[seq] = items
            if control:
                self._controls.add(seq)
            depth = len(self._done)
            if depth > self.max_depth:
                self.max_depth = depth
            self._cond.notify_all()

    def fail(self, seq: int, exc: BaseException) -> None:
        """Record that ``seq`` failed; the error is raised to the consumer in its turn."""
        self.complete(seq, _Failure(exc))

    def close(self) -> None:
        """Wake every waiter; later blocking calls raise :class:`ReorderBufferClosed`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- consumer side ------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Completed results held back waiting for an earlier sequence number."""
        with self._cond:
            return len(self._done)

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._next_reserve - self._next_emit - len(self._emitted)

    def pop(self, timeout: float | None = None) -> tuple[bool, Any]:
        """Next releasable ``(is_control, item)``; blocks until one is available.

        Raises the worker's exception when the failed item's turn comes (in ordered mode) or
        as soon as it is seen (non-deterministic mode).
        """
        with self._cond:
            while True:
                found = self._stash or self._take()
                self._stash = None
                if found is not None:
                    seq, item = found
                    self._cond.notify_all()
                    if isinstance(item, _Failure):
                        raise item.exc
                    is_control = seq in self._controls
                    self._controls.discard(seq)
                    return is_control, item
                if self._closed:
                    raise ReorderBufferClosed()
                if not self._cond.wait(timeout) and timeout is not None:
                    raise TimeoutError("reorder buffer: nothing to release")

    def pop_many(self, timeout: float | None = None) -> list[tuple[bool, Any]]:
        """Every item releasable now (at least one; blocks for the first)."""
        out = [self.pop(timeout)]
        with self._cond:
            while self._stash is None:
                found = self._take()
                if found is None:
                    break
                seq, item = found
                if isinstance(item, _Failure):
                    self._stash = (seq, item)  # raised by the next pop
                    break
                is_control = seq in self._controls
                self._controls.discard(seq)
                out.append((is_control, item))
            self._cond.notify_all()
        return out

    def _take(self) -> tuple[int, Any] | None:
        if self.ordered:
            seq = self._next_emit
            if seq not in self._done:
                return None
            self._next_emit += 1
            return seq, self._done.pop(seq)
        # Completion order, bounded by the first unreleased control item.
        barrier = min(self._controls, default=None)
        for seq in self._done:  # dict order is completion order
            if seq not in self._controls and (barrier is None or seq < barrier):
                return self._release(seq)
        if barrier is not None and barrier in self._done and self._all_below_released(barrier):
            return self._release(barrier)
        return None

    def _all_below_released(self, seq: int) -> bool:
        return all(s in self._emitted for s in range(self._next_emit, seq))

    def _release(self, seq: int) -> tuple[int, Any]:
        item = self._done.pop(seq)
        self._emitted.add(seq)
        while self._next_emit in self._emitted:
            self._emitted.discard(self._next_emit)
            self._next_emit += 1
        return seq, item
