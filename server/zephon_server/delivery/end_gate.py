"""The hub's side of ``end_of_data: shortest``: gating readers on the lanes' frontier.

:class:`EndGate` wraps a :class:`~.lane_ends.LaneEnds` for one hub run and is called, with
the hub's lock held, from a few marked call sites of :mod:`.hub` and :mod:`.readers`:

* the producer reports every batch and lane end (:meth:`EndGate.report`); a batch past the
  final end is *cut*: not kept, and the hub's log of that lane stops at the end;
* the pipeline's counting thread reports the batches a lane is promised
  (:meth:`EndGate.promise`), which moves the frontier before the batches exist;
* a reader asks :meth:`EndGate.gate` before taking seq ``s``: deliver it, wait, or take the
  lane's end (the same end on every lane, whatever the number of ranks);
* a reader that must wait does so in :meth:`EndGate.wait`, counting as demand for the lanes
  it waits for (:meth:`EndGate.wanted`, and their ``waiting``): the source feeds a wanted lane
  even past ``--max-ahead`` (it may have no consumer at all: one reader of one lane), and the
  hub's producer never waits at a full lane that is wanted, or while another lane is
  (:meth:`.hub.LaneHub._needed_elsewhere`): it keeps the full lane's batches up to the cap,
  then does not keep them (read later from a replay). So a reader blocked on the frontier
  never deadlocks with a producer blocked on a full lane, and the memory bound holds;
* the source's gate feeds a lane past the final end (:meth:`EndGate.past_end`) so that its
  cut batches are produced and their documents closed by the lane's end.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.lane_ends import DELIVER, END, WAIT, LaneEnds, applies
from ..engine.numbered_batch import NumberedBatch
from ..engine.records import LaneEnd
from ..engine.run import EndOfLane, PipelineRun
from .lane_buffer import LaneBuffer


class EndGate:
    """The frontier of one hub run (see the module docstring). Not thread-safe: every method
    runs with the hub's lock held."""

    def __init__(
        self,
        ends: LaneEnds,
        state: Mapping[int, LaneBuffer],
        conds: Mapping[int, threading.Condition],
        wake_all: Any,
    ) -> None:
        self.ends = ends
        self._state = state
        self._conds = conds
        self._wake_all = wake_all
        self._demand: dict[int, int] = {}  # lane -> readers waiting on the frontier for it

    @classmethod
    def of(
        cls,
        run: PipelineRun,
        lanes: Sequence[int],
        state: Mapping[int, LaneBuffer],
        conds: Mapping[int, threading.Condition],
        wake_all: Any,
    ) -> EndGate | None:
        """The gate of ``run`` when the common end applies (``shortest``, every lane served
        here); None otherwise."""
        pipeline = run.plan.pipeline
        if not applies(pipeline, lanes):
            return None
        starts = {lane: (log.start.next_seq, log.start.chain) for lane, log in run.logs.items()}
        return cls(LaneEnds(pipeline.end_of_data, starts), state, conds, wake_all)

    def report(self, item: NumberedBatch | LaneEnd, run: PipelineRun) -> bool:
        """The producer's ``item``; False for a batch past the final end (not kept). Wakes
        every lane's readers when the frontier or the end moved."""
        ends = self.ends
        before = (ends.frontier, ends.bound, ends.end)
        if isinstance(item, NumberedBatch):
            if not ends.add(item):
                return False
        else:
            log_ = run.logs[item.lane_id]
            ends.finish(item.lane_id, log_.next_seq, log_.tail_tombstones)
        if (ends.frontier, ends.bound, ends.end) != before:
            self._wake_all()
        return True

    def promise(self, lane: int, batches: int) -> None:
        """``lane`` will produce ``batches`` batches at least (:mod:`..engine.lane_promises`);
        wakes every lane's readers when that moves the frontier."""
        before = self.ends.frontier
        self.ends.promise(lane, batches)
        if self.ends.frontier != before:
            self._wake_all()

    def past_end(self, st: LaneBuffer) -> bool:
        """Whether ``st``'s lane reached the final common end (feed it: its batches are cut)."""
        end = self.ends.end
        return end is not None and st.next_seq >= end

    def wanted(self, lane: int) -> bool:
        """Whether a reader waits on the frontier for ``lane`` to produce more."""
        return self._demand.get(lane, 0) > 0

    def any_wanted(self) -> int | None:
        """A lane some reader waits on the frontier for, or None. The producer must not wait
        at a full lane then (the pipeline's next batch may be that full lane's, ahead of the
        wanted lane's): it keeps the full lane's batches up to the cap instead."""
        return next((lane for lane, n in self._demand.items() if n > 0), None)

    def gate(self, lane: int, seq: int) -> str | EndOfLane:
        """For a reader of ``lane`` at ``seq``: DELIVER, WAIT, or the lane's end."""
        ends = self.ends
        status = ends.status(seq)
        if status != END:
            return status
        item = ends.end_of(lane)
        if item is None:
            return WAIT  # the lane's cut batches are still being produced
        return EndOfLane(item.next_seq, item.chain, item.tombstones)

    def wait(self, lane: int, seq: int, timeout: float, producer_waiting: bool) -> None:
        """A reader of ``lane`` at ``seq`` waits for the frontier, as demand for the lanes it
        waits for (the lane itself when only its cut tail is missing)."""
        lagging = self.ends.lagging(seq) if self.ends.end is None else [lane]
        marked = [self._state[k] for k in lagging if k in self._state]
        for st in marked:
            st.waiting += 1
            self._demand[st.lane] = self._demand.get(st.lane, 0) + 1
        if producer_waiting:
            self._wake_all()  # the producer re-checks for demand
        try:
            self._conds[lane].wait(timeout)
        finally:
            for st in marked:
                st.waiting -= 1
                self._demand[st.lane] -= 1

    def stats(self) -> dict[str, Any]:
        """The policy, the common end and the batches cut per lane (:meth:`LaneEnds.stats`)."""
        return self.ends.stats()


__all__ = ["DELIVER", "EndGate"]
