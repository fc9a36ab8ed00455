"""Accumulators: the serial, per-lane grouping step in front of every operator's workers.

An accumulator receives elements in upstream order on one thread, decides when a group is
ready and returns ready *micro-batches* (lists of elements) for the workers. State is kept
per lane in small slot objects so that ``flush(reset=True, lane_id=l)`` can reset one lane
and leave every other lane untouched. See the spec page, "Accumulators".
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from typing import Any

from ..errors import refuse_abstract

MicroBatch = list[Any]


class Accumulator(abc.ABC):
    """Abstract accumulator: the four methods and the ``reads_payload`` flag of the spec page.

    ``push_many``, ``flush`` and ``has_pending_data`` are abstract (the spec gives them no
    default); ``try_epoch_reset`` has the spec's conservative default. Instantiating a
    subclass that misses one raises ``TypeError`` naming the methods.
    """

    #: Set to True when push_many inspects payloads (the runner then resolves lazy handles).
    reads_payload: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Accumulator:
        refuse_abstract(cls, "accumulator", "docs/custom-operators.md")
        return super().__new__(cls)

    @abc.abstractmethod
    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        """Consume elements from upstream (in order) and return zero or more micro-batches."""

    @abc.abstractmethod
    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        """Emit what is buffered: every lane at end of stream, or one lane (and reset it)."""

    @abc.abstractmethod
    def has_pending_data(self, lane_id: int | None = None) -> bool:
        """Whether a flush (of ``lane_id``, or of any lane) would produce anything."""

    def try_epoch_reset(self, boundary_chunk_id: int, lane_id: int) -> bool:
        """Whether a stalled sentinel at ``boundary_chunk_id`` may be released for the lane.

        Conservative default: only when nothing is pending on that lane.
        """
        return not self.has_pending_data(lane_id)

    def end_lane(self, lane_id: int) -> list[MicroBatch]:
        """The lane has ended: emit what is buffered for it (default: a resetting flush)."""
        return self.flush(reset=True, lane_id=lane_id)

    def poll(self, now: float | None = None) -> list[MicroBatch]:
        """Time-based flushes (only for accumulators with a latency bound); default none."""
        return []


class PassthroughAccumulator(Accumulator):
    """Emits whatever arrives, immediately, with no buffering and no state."""

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        return [list(elems)] if elems else []

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        return []

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        return False


class _LaneSlot:
    """Per-lane buffer of a :class:`CountingAccumulator`."""

    __slots__ = ("count", "items", "since")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.count = 0  # elements that count toward max_batch
        self.since = 0.0  # monotonic time of the first buffered element


class CountingAccumulator(Accumulator):
    """Buffers per lane and emits a lane's micro-batch when it reaches ``max_batch``.

    With ``max_latency_ms`` set, a partial micro-batch is emitted once its oldest element is
    that old (from ``push_many`` or ``poll``). Built-in operators pass ``None`` when the runner
    is deterministic, so boundaries then depend only on counts.
    """

    def __init__(self, max_batch: int, max_latency_ms: float | None = None) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if max_latency_ms is not None and max_latency_ms <= 0:
            raise ValueError(f"max_latency_ms must be > 0 or None, got {max_latency_ms!r}")
        self.max_batch = max_batch
        self.max_latency_ms = max_latency_ms
        self._lanes: dict[int, _LaneSlot] = {}

    def _counts(self, elem: Any) -> bool:
        """Whether ``elem`` counts toward ``max_batch`` (subclasses exclude tombstones)."""
        return True

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        out: list[MicroBatch] = []
        lanes = self._lanes
        latency = self.max_latency_ms
        now = time.monotonic() if latency is not None else 0.0
        for elem in elems:
            lane = elem.meta.lane_id
            slot = lanes.get(lane)
            if slot is None:
                slot = lanes[lane] = _LaneSlot()
            if not slot.items:
                slot.since = now
            slot.items.append(elem)
            if self._counts(elem):
                slot.count += 1
                if slot.count >= self.max_batch:
                    out.append(slot.items)
                    slot.items = []
                    slot.count = 0
        if latency is not None:
            out.extend(self.poll(now))
        return out

    def poll(self, now: float | None = None) -> list[MicroBatch]:
        if self.max_latency_ms is None:
            return []
        now = time.monotonic() if now is None else now
        limit = self.max_latency_ms / 1000.0
        out = []
        for slot in self._lanes.values():
            if slot.items and now - slot.since >= limit:
                out.append(slot.items)
                slot.items = []
                slot.count = 0
        return out

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        if lane_id is not None:
            slot = self._lanes.pop(lane_id, None) if reset else self._lanes.get(lane_id)
            if slot is None or not slot.items:
                return []
            items, slot.items, slot.count = slot.items, [], 0
            return [items]
        out = [slot.items for slot in self._lanes.values() if slot.items]
        self._lanes.clear()
        return out

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        if lane_id is not None:
            slot = self._lanes.get(lane_id)
            return bool(slot and slot.items)
        return any(slot.items for slot in self._lanes.values())

    def pending(self, lane_id: int) -> list[Any]:
        """The elements buffered for a lane (read-only view for subclasses and tests)."""
        slot = self._lanes.get(lane_id)
        return list(slot.items) if slot else []

    def lanes_state(self) -> dict[int, int]:
        """Buffered element count per lane (for tests and metrics)."""
        return {lane: len(slot.items) for lane, slot in self._lanes.items() if slot.items}
