"""Lower bounds of each lane's batch count, from the records that have entered its tail.

Under ``end_of_data: shortest`` a reader at seq ``s`` waits until no lane can end at or before
``s`` (:mod:`.lane_ends`). Knowing that only from the batches produced makes the first batch
wait for every lane's first batch, and a lane's first batch waits for its shuffle buffer to
fill. Yet a lane is often bound to produce a batch long before it does:

* the *conserving tail* of a plan is its last steps made only of ``shuffle``,
  ``ensure_mixture``, the replay filter and ``batch``: each emits every record it receives
  (they reorder and buffer, and flush everything at sentinels and at the end of a lane);
* ``batch`` makes one batch of every ``microbatch_size`` records that are not tombstones
  (tombstones take no row), and at most one partial batch more, which ``drop_last`` drops;
* so a lane whose tail has received ``r`` records will produce at least ``r // B`` batches
  after its start. This holds for a lane without a replay cursor only: the replay filter
  drops a resumed lane's records before its cursor.

:class:`LanePromises` counts, in the driver of the tail's first step (the thread that
pushes records into its accumulator, in stream order), the records each fresh lane sends in,
and tells its listener whenever a lane's bound grows. The hub hands the bound to its frontier
(:meth:`.lane_ends.LaneEnds.promise`). The bound only ever lets a batch out sooner: which
batches exist, and where the lanes end, stay a function of the data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .ops.base import Operator
from .ops.batch import Batch
from .ops.mixture import EnsureMixture
from .ops.replay import ReplayFilter
from .ops.shuffle import Shuffle

#: Operators that emit every record they receive (exact types: a subclass may drop).
CONSERVING: tuple[type[Operator], ...] = (Shuffle, EnsureMixture, ReplayFilter, Batch)
#: Those of them that hold records back (the replay filter passes them on at once).
BUFFERING: tuple[type[Operator], ...] = (Shuffle, EnsureMixture)


def counting_step(steps: Sequence[Sequence[Operator]]) -> tuple[int, int] | None:
    """``(index of the step whose input is counted, batch size)`` for a plan's steps (each
    a list of operators, in order), or None when counting gains nothing: the last step is
    not ``batch`` alone, or no shuffle or mixture buffers records in the tail before it."""
    if not steps or len(steps[-1]) != 1 or type(steps[-1][0]) is not Batch:
        return None
    first = len(steps) - 1
    while first > 0 and all(type(op) in CONSERVING for op in steps[first - 1]):
        first -= 1
    if not any(type(op) in BUFFERING for ops in steps[first:] for op in ops):
        return None  # nothing holds records back: a batch is out as soon as it is promised
    batch = steps[-1][0]
    assert isinstance(batch, Batch)
    return first, batch.microbatch_size


class LanePromises:
    """Per fresh lane, the records its tail received and the batches that promises.

    ``starts``: fresh lane -> the seq it starts at (lanes with a replay cursor are left out).
    ``listener(lane, batches)`` is called, from the counting thread, each time a lane is
    promised more: it will produce batches up to seq ``batches`` (exclusive) at least.
    """

    def __init__(
        self,
        batch_size: int,
        starts: Mapping[int, int],
        listener: Callable[[int, int], None],
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self._starts = dict(starts)
        self._records = dict.fromkeys(self._starts, 0)
        self.promised = dict(self._starts)
        self._listener = listener
        self._lock = threading.Lock()  # one counting thread; the lock keeps reads whole

    def count(self, elems: Iterable[Any]) -> None:
        """Records ``elems`` (in stream order) enter the tail."""
        seen: dict[int, int] = {}
        for elem in elems:
            meta = elem.meta
            if not meta.tombstone:
                seen[meta.lane_id] = seen.get(meta.lane_id, 0) + 1
        grown = []
        with self._lock:
            for lane, n in seen.items():
                if lane not in self._records:
                    continue  # a resumed lane: its replay filter may drop records
                total = self._records[lane] + n
                self._records[lane] = total
                batches = self._starts[lane] + total // self.batch_size
                if batches > self.promised[lane]:
                    self.promised[lane] = batches
                    grown.append((lane, batches))
        for lane, batches in grown:
            self._listener(lane, batches)
