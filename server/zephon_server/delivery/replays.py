"""Shared replays: one regeneration of a lane for every consumer that needs its older batches.

A consumer opening a lane at a seq the hub's log no longer holds is served by a *replay*: a run
of that lane alone, resumed at a cut of the lane's retained history, which regenerates the lane
from the epoch boundary before the cut (DESIGN.md §6). Cuts fall between whole batches (the
replay filter sits right before ``batch``), so a run resumed at any cut of one epoch produces
the same batches from that cut on. A replay therefore starts at its epoch's *first* retained
cut, and a consumer asking for a seq of that epoch (or of a later one the replay has reached)
that the replay has not passed yet joins it and skips the batches below its seq: thirty
reconnects at one evicted seq cost one regeneration, not thirty.

Invariants:

* A replay keeps at most ``window`` batches beyond its slowest reader's position (its
  producer thread waits for that reader: backpressure, like the live log) and ``window``
  behind it, so that a consumer opening a little later at the same seq still joins.
* It closes when its last reader leaves; its regeneration stops then, at the lane's end, or
  on an error, which its readers get. The hub hands a reader over to the live log as soon as
  the live log holds its next seq again, so a replay lasts only while someone is behind.
* At most ``limit`` replays regenerate at once (``--max-replays``); a consumer that needs one
  more is refused with :class:`ReplayLimit`, which names the limit and the fix.

All state is guarded by the hub's lock; each replay has its own condition on that lock, so a
batch wakes only that replay's readers.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..engine.errors import ConfigError, ZephonError
from ..engine.numbered_batch import NumberedBatch
from ..engine.records import LaneEnd
from ..engine.run import EndOfLane, PipelineRun

log = logging.getLogger(__name__)


class ReplayLimit(ZephonError):
    """A consumer needs a replay while ``--max-replays`` replays are running already."""


class SharedReplay:
    """One regeneration of ``lane`` from the cut at ``start_seq`` (epoch ``boundary``).

    ``make_run`` builds the run (on the replay's thread, outside the hub's lock). Readers are
    consumer names with the next seq each will read.
    """

    def __init__(
        self,
        lane: int,
        start_seq: int,
        boundary: int,
        *,
        k: int,
        window: int,
        lock: threading.RLock,
        make_run: Callable[[], PipelineRun],
        on_finished: Callable[[SharedReplay], None],
    ) -> None:
        self.lane = lane
        self.start_seq = start_seq
        self.boundary = boundary
        self.reached = boundary  # epoch boundary of the newest batch regenerated
        self.window = window
        self.cond = threading.Condition(lock)
        self.batches: deque[NumberedBatch] = deque()
        self.next_seq = start_seq
        self.readers: dict[str, int] = {}
        self.end: EndOfLane | None = None
        self.error: BaseException | None = None
        self.closed = False  # no readers left (or the hub stopped): regeneration stops
        self.finished = False  # the producer thread is done
        self._k = k
        self._make_run = make_run
        self._on_finished = on_finished
        self._run: PipelineRun | None = None
        self._thread = threading.Thread(
            target=self._produce, name=f"zephon-replay-{lane}", daemon=True
        )

    # -- the hub's side (its lock held) ----------------------------------------------------

    @property
    def first_seq(self) -> int:
        return self.batches[0].seq if self.batches else self.next_seq

    def serves(self, seq: int, boundary: int) -> bool:
        """Whether a reader of ``seq`` (whose resume boundary is ``boundary``) may join: the
        replay has not passed ``seq`` and has reached its epoch."""
        return (
            not self.closed and self.error is None and self.first_seq <= seq
        ) and boundary <= self.reached

    def add_reader(self, consumer: str, seq: int) -> None:
        self.readers[consumer] = seq

    def remove_reader(self, consumer: str) -> bool:
        """Forget a reader; True when it was the last one (the replay is closed then)."""
        if self.readers.pop(consumer, None) is None:
            return False
        self._evict()
        if not self.readers:
            self.closed = True
        self.cond.notify_all()
        return self.closed

    def item(self, seq: int) -> NumberedBatch | EndOfLane | None:
        """Batch ``seq``, the lane's end past its last batch, or None (not regenerated yet)."""
        first = self.first_seq
        if first <= seq < self.next_seq:
            return self.batches[seq - first]
        if self.end is not None and seq >= self.end.next_seq:
            return self.end
        return None

    def took(self, consumer: str, next_seq: int) -> None:
        """Reader ``consumer`` read up to ``next_seq``: the window moves on."""
        if consumer in self.readers:
            self.readers[consumer] = next_seq
            self._evict()
            self.cond.notify_all()

    def _slowest(self) -> int:
        return min(self.readers.values()) if self.readers else self.next_seq

    def _evict(self) -> None:
        keep_from = self._slowest() - self.window
        while self.batches and self.batches[0].seq < keep_from:
            self.batches.popleft()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop regenerating at once (not with the hub's lock held: it joins runner threads)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            run = self._run
        if run is not None:
            run.close()

    def _produce(self) -> None:
        run: PipelineRun | None = None
        try:
            run = self._make_run()
            with self.cond:
                if self.closed:
                    return
                self._run = run
            for item in run:
                with self.cond:
                    if not self._accept(item, run):
                        return
                    self.cond.notify_all()
        except BaseException as exc:
            with self.cond:
                if not self.closed:
                    log.warning("replay of lane %d failed: %s", self.lane, exc)
                    self.error = exc
        finally:
            with self.cond:
                self.finished = True
                self.cond.notify_all()
            if run is not None:
                run.close()
            self._on_finished(self)

    def _accept(self, item: Any, run: PipelineRun) -> bool:
        """Add one item of the run (the lock is held); False when regeneration should stop."""
        if isinstance(item, NumberedBatch):
            while not self.closed and item.seq - self._slowest() >= self.window:
                self.cond.wait(0.5)  # the window is full: wait for the slowest reader
            if self.closed:
                return False
            self.next_seq = item.seq + 1
            self.reached = max(self.reached, (int(item.rows[-1].cursor[0]) // self._k) * self._k)
            if item.seq >= self._slowest() - self.window:  # else far below every reader
                self.batches.append(item)
            return True
        if isinstance(item, LaneEnd):
            self.end = EndOfLane.of(run.logs[self.lane])
            return False
        return not self.closed


#: The fewest replays the default limit (one per served lane) allows at once.
MIN_AUTO_REPLAYS = 4


class ReplayPool:
    """The hub's replays: finding one to join, the ``--max-replays`` limit, figures."""

    @classmethod
    def serving(cls, lanes: int, limit: int | None) -> ReplayPool:
        """The pool of a hub serving ``lanes`` lanes: ``limit`` replays at once, or by default
        one per lane (at least :data:`MIN_AUTO_REPLAYS`), so that one consumer of every lane
        that fell behind (a trainer resumed far back) gets every lane's replay at once."""
        return cls(max(MIN_AUTO_REPLAYS, lanes) if limit is None else limit)

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(
                f"max_replays (--max-replays) must be an integer >= 0 (0: no replays), got "
                f"{limit!r}"
            )
        self.limit = limit
        self._replays: list[SharedReplay] = []
        self.started = 0
        self.refused = 0

    def find(self, lane: int, seq: int, boundary: int) -> SharedReplay | None:
        """A replay of ``lane`` that ``seq`` (resume boundary ``boundary``) can join."""
        for replay in self._replays:
            if replay.lane == lane and replay.serves(seq, boundary):
                return replay
        return None

    @property
    def running(self) -> int:
        """Replays still regenerating (closing ones until their thread is done)."""
        return sum(not r.finished for r in self._replays)

    def admit(self, lane: int, seq: int, boundary: int) -> None:
        """Raise :class:`ReplayLimit` when another replay would pass the limit."""
        if self.running < self.limit:
            return
        self.refused += 1
        raise ReplayLimit(
            f"lane {lane}: seq {seq} needs a replay (regenerating the lane from chunk "
            f"{boundary}), but {self.running} replays are running already (--max-replays "
            f"{self.limit}); raise --max-replays, or reconnect later"
        )

    def add(self, replay: SharedReplay) -> None:
        self._replays.append(replay)
        self.started += 1

    def leave(self, consumer: str, replay: SharedReplay) -> bool:
        """``consumer`` stops reading ``replay``; True when the replay should stop now."""
        return replay.remove_reader(consumer)

    def finished(self, replay: SharedReplay) -> None:
        """A replay's thread is done: forget it once nobody reads it (the lock is held)."""
        if replay.closed and replay in self._replays:
            self._replays.remove(replay)

    def forget_closed(self) -> None:
        """Drop replays whose readers all left and whose threads are done."""
        self._replays = [r for r in self._replays if not (r.closed and r.finished)]

    def close_all(self) -> list[SharedReplay]:
        """Every replay, closed and forgotten (hub stop or resume): the caller stops them."""
        replays, self._replays = self._replays, []
        for replay in replays:
            replay.closed = True
            replay.cond.notify_all()
        return replays

    def stats(self) -> dict[str, int]:
        return {
            "running": self.running,
            "readers": sum(len(r.readers) for r in self._replays),
            "started": self.started,
            "refused": self.refused,
            "limit": self.limit,
        }
