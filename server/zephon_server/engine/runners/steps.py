"""Steps and their serial drivers: the runner-independent half of every runner.

A *step* is one accumulator in front of one worker function: a single operator, or a run of
fusable operators the planner put into the same worker call. A :class:`StepDriver` owns the
step's accumulator and is only ever called from one thread. It turns incoming elements and
control items into an ordered list of *tasks* (micro-batches for the workers) and controls:

* elements go to ``push_many``;
* a :class:`FlushSentinel` calls ``flush(reset=True, lane_id=lane)`` and is forwarded after
  the flushed micro-batches; if the lane still has pending data afterwards, the accumulator
  broke the contract and the driver raises, naming the operator;
* for the one stalling operator (``batch(drop_last=True)``) a sentinel meeting pending data
  on its lane is held back, per lane, and released once ``try_epoch_reset`` succeeds. The
  step asks its operator (``stalls_at_sentinel()``), and honours the answer only from the
  built-in ``batch``: stalling is not an extension point (the checkpoint holds no replay
  state for another stalling operator), so any other operator answering True is a
  :class:`ContractError` when the plan is built;
* a :class:`LaneEnd` calls ``end_lane`` and is forwarded after what that emits.
"""

from __future__ import annotations

import bisect
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import ContractError, WorkerError, ZephonError
from ..ops.accumulators import Accumulator
from ..ops.base import Operator
from ..ops.batch import Batch
from ..records import FlushSentinel, LaneEnd
from ..shm import resolve_payloads

CONTROL_TYPES = (FlushSentinel, LaneEnd)


class OpTiming:
    """A small thread-safe histogram of worker seconds per micro-batch."""

    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BUCKETS) + 1)
        self.total = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.BUCKETS, seconds)
        with self._lock:
            self.counts[i] += 1
            self.total += seconds

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative ``(le, count)`` buckets (Prometheus style) and the sum."""
        with self._lock:
            counts, total = list(self.counts), self.total
        out, running = [], 0
        for bound, n in zip((*map(str, self.BUCKETS), "+Inf"), counts):
            running += n
            out.append((bound, running))
        return out, total


class Step:
    """A run of operators executed in one worker call, grouped by the first one's accumulator."""

    def __init__(self, ops: Sequence[Operator], index: int, workers: int = 1) -> None:
        if not ops:
            raise ValueError("a step needs at least one operator")
        self.ops = list(ops)
        self.index = index
        self.workers = workers
        self.name = "+".join(op.op_name for op in self.ops)
        # The runner decides stalling from the operator instance, not from a trait.
        self.stalls = _stalls(self.ops)
        self.timing = OpTiming()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["timing"] = None  # per process; recreated on unpickling
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.timing = OpTiming()

    @property
    def head(self) -> Operator:
        return self.ops[0]

    @property
    def microbatch_size(self) -> int:
        return self.head.microbatch_size

    def run(self, elems: list[Any]) -> list[Any]:
        """The worker function: every operator of the step, in order, on one micro-batch."""
        started = time.perf_counter()
        elems = resolve_payloads(elems)
        for op in self.ops:
            if not elems:
                break
            try:
                elems = op.run_many(elems)
            except ZephonError:
                raise
            except Exception as exc:
                raise WorkerError(
                    op.op_name, f"{type(exc).__name__}: {exc}", traceback.format_exc()
                ) from exc
        self.timing.observe(time.perf_counter() - started)
        return elems


def _stalls(ops: Sequence[Operator]) -> bool:
    """Whether a step holds sentinels back: its head is the built-in ``batch`` and says so."""
    stalling = [position for position, op in enumerate(ops) if op.stalls_at_sentinel()]
    for position in stalling:
        op = ops[position]
        if type(op) is not Batch or position != 0:
            raise ContractError(
                f"operator {op.op_name!r} ({type(op).__name__}): stalls_at_sentinel() returned "
                "True, but only the built-in batch(drop_last=True) may hold a flush sentinel "
                "back; return False (the default) and make flush(reset=True, lane_id=...) emit "
                "and reset the lane (see 'Flush sentinels and stalling')"
            )
    return bool(stalling)


class Task:
    """One micro-batch for the workers of a step."""

    __slots__ = ("elems", "step")

    def __init__(self, step: Step, elems: list[Any]) -> None:
        self.step = step
        self.elems = elems


class StepDriver:
    """Drives one step's accumulator serially (see the module docstring)."""

    def __init__(self, step: Step, accumulator: Accumulator) -> None:
        self.step = step
        self.acc = accumulator
        #: Called with every run of elements before they are pushed (in stream order): the
        #: tail's first step counts records for :class:`~..lane_promises.LanePromises`.
        self.counter: Callable[[list[Any]], None] | None = None
        self.held: dict[int, deque[FlushSentinel]] = {}
        self.stalled_seconds = 0.0
        self._stall_started: dict[int, float] = {}
        self.sentinels_stalled_total = 0

    @property
    def stalled_lanes(self) -> int:
        """Lanes currently holding a sentinel back."""
        return sum(1 for q in self.held.values() if q)

    def feed(self, items: Iterable[Any]) -> list[Any]:
        """Tasks and controls, in order, for a list of incoming elements and controls."""
        out: list[Any] = []
        run: list[Any] = []
        for item in items:
            if isinstance(item, CONTROL_TYPES):
                if run:
                    self._push(run, out)
                    run = []
                if isinstance(item, FlushSentinel):
                    self._on_sentinel(item, out)
                elif isinstance(item, LaneEnd):
                    self._on_lane_end(item, out)
            else:
                run.append(item)
        if run:
            self._push(run, out)
        return out

    def poll(self) -> list[Any]:
        """Latency flushes (non-deterministic mode only)."""
        return [Task(self.step, mb) for mb in self.acc.poll()]

    def finish(self) -> list[Any]:
        """End of stream: flush everything and release any held sentinel."""
        out = [Task(self.step, mb) for mb in self.acc.flush(reset=False, lane_id=None) if mb]
        for lane in sorted(self.held):
            out.extend(self._release_all(lane))
        return out

    # -- internals ------------------------------------------------------------------------

    def _push(self, elems: list[Any], out: list[Any]) -> None:
        if self.counter is not None:
            self.counter(elems)
        if self.acc.reads_payload:
            resolve_payloads(elems)
        out.extend(Task(self.step, mb) for mb in self.acc.push_many(elems) if mb)
        if self.held:
            for lane in {e.meta.lane_id for e in elems}:
                self._try_release(lane, out)

    def _on_sentinel(self, sentinel: FlushSentinel, out: list[Any]) -> None:
        lane = sentinel.lane_id
        acc = self.acc
        if self.step.stalls:
            queue = self.held.get(lane)
            if queue or acc.has_pending_data(lane):
                self.held.setdefault(lane, deque()).append(sentinel)
                self.sentinels_stalled_total += 1
                self._stall_started.setdefault(lane, time.monotonic())
                self._try_release(lane, out)
                return
        out.extend(Task(self.step, mb) for mb in acc.flush(reset=True, lane_id=lane) if mb)
        if acc.has_pending_data(lane):
            raise ContractError(
                f"operator {self.step.head.op_name!r}: accumulator {type(acc).__name__} still "
                f"has pending data for lane {lane} after flush(reset=True, lane_id={lane}); "
                "flush must emit and fully reset that lane (see 'What fully reset means')"
            )
        out.append(sentinel)

    def _try_release(self, lane: int, out: list[Any]) -> None:
        queue = self.held.get(lane)
        while queue and self.acc.try_epoch_reset(queue[0].boundary_chunk_id, lane):
            out.append(queue.popleft())
        if queue is not None and not queue:
            del self.held[lane]
            started = self._stall_started.pop(lane, None)
            if started is not None:
                self.stalled_seconds += time.monotonic() - started

    def _release_all(self, lane: int) -> list[Any]:
        queue = self.held.pop(lane, deque())
        started = self._stall_started.pop(lane, None)
        if started is not None:
            self.stalled_seconds += time.monotonic() - started
        return list(queue)

    def _on_lane_end(self, end: LaneEnd, out: list[Any]) -> None:
        lane = end.lane_id
        out.extend(Task(self.step, mb) for mb in self.acc.end_lane(lane) if mb)
        out.extend(self._release_all(lane))
        out.append(end)
