"""The replay filter: after a resume, drops the records a lane already delivered.

The planner inserts it immediately before ``batch``. On resume each lane is regenerated from
its last epoch boundary; the filter drops that lane's records up to and including the replay
cursor (the last record of the last delivered batch), in stream order, then passes
everything. Its accumulator holds no data, so at a sentinel it flushes as a no-op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import Cursor
from .accumulators import MicroBatch, PassthroughAccumulator
from .base import OpContext, Operator, OpTraits

REPLAY_CURSORS = "replay_cursors"


class ReplayFilterAccumulator(PassthroughAccumulator):
    """Drops each lane's records through its replay cursor; counts what it dropped."""

    def __init__(self, targets: dict[int, Cursor]) -> None:
        self.targets = dict(targets)
        self.dropped = 0

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        targets = self.targets
        if not targets:
            return [list(elems)] if elems else []
        kept = []
        for elem in elems:
            meta = elem.meta
            target = targets.get(meta.lane_id)
            if target is None:
                kept.append(elem)
                continue
            self.dropped += 1
            if not meta.tombstone and meta.cursor == target:
                del targets[meta.lane_id]
        return [kept] if kept else []


class ReplayFilter(Operator):
    """Inserted by the planner before ``batch``; never configured by users."""

    op_name = "replay_filter"

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, fusable=False)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> ReplayFilterAccumulator:
        return ReplayFilterAccumulator(ctx.extras.get(REPLAY_CURSORS, {}))

    def run_many(self, elems: Sequence[Any]) -> list[Any]:
        return list(elems)

    def process_many(self, elems: list[Any]) -> list[Any]:
        return elems
