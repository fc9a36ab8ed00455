"""Consumers' streams of a hub's lanes: from the live log, or from a shared replay.

A reader reads its lane's log while the log holds its next seq; when it does not (the batch
was not kept, or the reader opened at an older seq) it reads a shared replay
(:mod:`.replays`) and goes back to the log as soon as the log holds its next seq again. Either
way it yields the same batches, in seq order, then an :class:`EndOfLane`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..engine.lane_ends import DELIVER
from ..engine.numbered_batch import NumberedBatch
from ..engine.run import EndOfLane
from .lane_buffer import LaneBuffer
from .replays import SharedReplay

if TYPE_CHECKING:
    from .hub import LaneHub


class LaneReader(Iterator["NumberedBatch | EndOfLane"]):
    """One consumer's stream of a lane (:meth:`LaneHub.open`): its batches in seq order, then
    an :class:`EndOfLane`; from the live log, or from a shared replay until the live log holds
    its next seq again (then from the log).

    Iterating blocks until the next item exists (the reader *waits for a seq* there);
    :meth:`poll` takes the next batch only if it exists already, and :meth:`linger` waits for
    more to exist. How many batches a message carries is not decided here but by the
    stream's :class:`~.message_planner.MessagePlanner`.
    """

    def __init__(self, hub: LaneHub, lane: int, consumer: str, seq: int, generation: int) -> None:
        self._hub = hub
        self._lane = lane
        self._consumer = consumer
        self._seq = seq
        self._generation = generation
        self._done = False

    def _replay(self, st: LaneBuffer) -> SharedReplay | None:
        """This reader's replay, None once it reads the live log (the lock is held)."""
        replay = st.replaying.get(self._consumer)
        if replay is not None and self._hub._hand_over(st, self._consumer, replay, self._seq):
            return None
        return replay

    def _ahead(self, st: LaneBuffer) -> bool:
        """Whether this reader is as far ahead of its lane's slowest consumer (replay readers
        included) as a lane's log may run: a replay reader then waits, as a live one waits
        for the producer, so a peer that reads a replay does not run away from a stuck one."""
        return self._seq >= st.position() + self._hub.limit

    def __next__(self) -> NumberedBatch | EndOfLane:
        if self._done:
            raise StopIteration
        hub, lane = self._hub, self._lane
        with hub._cond:
            while True:
                hub._check(self._generation)
                st = hub._state[lane]
                replay = self._replay(st)
                if replay is None and self._consumer not in st.consumers:
                    self._done = True  # closed (the call was cancelled) while waiting
                    raise StopIteration
                end_gate = hub.end_gate  # end_of_data: the lanes' frontier comes first
                if end_gate is not None:
                    gate = end_gate.gate(lane, self._seq)
                    if isinstance(gate, EndOfLane):
                        self._done = True
                        return gate
                    if gate != DELIVER:
                        end_gate.wait(lane, self._seq, 0.5, hub._blocked is not None)
                        continue
                got = (replay or st).item(self._seq)
                if replay is not None and isinstance(got, NumberedBatch) and self._ahead(st):
                    got = None  # a replay keeps to the live log's bound too
                if isinstance(got, NumberedBatch):
                    self._seq += 1
                    if replay is not None:
                        replay.took(self._consumer, self._seq)
                    return got
                if got is not None:
                    self._done = True
                    return got
                if replay is not None:
                    if replay.error is not None:
                        raise replay.error
                    replay.cond.wait(0.5)
                elif self._seq < st.next_seq:
                    hub._to_replay(st, self._consumer, self._seq)  # not in the log (any more)
                else:
                    hub._await_batch(st, hub._lane_conds[lane], 0.5)

    def poll(self) -> NumberedBatch | None:
        """The next batch if it is produced already, else None; never waits. None too at the
        lane's end, when the stream closed or the run failed: the next ``next()`` says which."""
        hub = self._hub
        with hub._cond:
            if self._done or hub._problem(self._generation) is not None:
                return None
            st = hub._state[self._lane]
            replay = st.replaying.get(self._consumer)
            end_gate = hub.end_gate  # end_of_data: only what the frontier lets out
            if end_gate is not None and end_gate.gate(self._lane, self._seq) != DELIVER:
                return None
            batch = (replay or st).item(self._seq)
            if not isinstance(batch, NumberedBatch) or (replay is not None and self._ahead(st)):
                return None
            self._seq += 1
            if replay is not None:
                replay.took(self._consumer, self._seq)
            return batch

    def linger(self, count: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until ``count`` batches past this reader's position
        exist (less when the lane ends, the stream closes or the run fails). A reader of a
        replay does not wait: what the replay has is what it gets."""
        hub = self._hub
        with hub._cond:
            st = hub._state[self._lane]
            if st.replaying.get(self._consumer) is None:
                self._linger(st, count, time.monotonic() + timeout)

    def _linger(self, st: LaneBuffer, count: int, deadline: float) -> None:
        """Wait (holding the hub's lock) until ``count`` batches past this reader's position
        are produced, or until ``deadline``, the lane's end, the consumer's close or a run
        problem, whichever comes first."""
        hub = self._hub
        end_gate = hub.end_gate  # end_of_data: batches count once the frontier lets them out
        while (
            self._deliverable(st) - self._seq < count
            and (st.end if end_gate is None else end_gate.ends.end) is None
            and self._consumer in st.consumers
            and hub._problem(self._generation) is None
        ):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            frontier = end_gate.ends.frontier if end_gate is not None else st.next_seq
            if end_gate is not None and frontier < min(st.next_seq, self._seq + count):
                # the lane has them, the frontier not yet: wait as demand for the lagging lanes
                end_gate.wait(self._lane, frontier, left, hub._blocked is not None)
            else:
                hub._await_batch(st, hub._lane_conds[self._lane], left)

    def _deliverable(self, st: LaneBuffer) -> int:
        """The lane's next seq not yet produced, or not yet let out by the frontier."""
        end_gate = self._hub.end_gate
        if end_gate is None:
            return st.next_seq
        return min(st.next_seq, end_gate.ends.frontier)
