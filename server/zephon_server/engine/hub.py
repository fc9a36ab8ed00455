"""The lane hub: one pipeline run shared by every consumer of a server's lanes.

The hub runs the pipeline on a producer thread and keeps, per lane, a log of recent batches.
Consumers read by absolute seq; several consumers of one lane (tensor/pipeline-parallel
peers) get the identical batch objects, computed once. Memory is bounded per lane: the
source stops feeding a lane once it is ``max_ahead`` batches ahead of its slowest consumer,
so a slow consumer holds back only its own lane, and consumed batches are kept only
``keep_consumed`` deep for quick reconnects. A consumer asking for an older seq is served
by a private *replay* run regenerated from that lane's nearest epoch boundary.

The hub never imports gRPC; the service adapts it to the protocol.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import (
    CheckpointError,
    CheckpointStore,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    ResumeState,
)
from .checkpoint_key import CheckpointKey
from .errors import ConfigError, ZephonError
from .execution import ExecutionConfig
from .manifest import ShardManifest, manifest_dir, save_manifest
from .pipeline import Pipeline
from .planner import Plan
from .records import LaneEnd, SampleBatch, SampleMeta
from .replay_cache import ReplayCache
from .run import LaneLog, PipelineRun

log = logging.getLogger(__name__)


class OutOfRange(ZephonError):
    """A seq that is no longer, or not yet, reachable on a lane."""


class HubClosed(ZephonError):
    """The hub is stopping (drain) or was reset by a resume."""


class BadLane(ZephonError, ValueError):
    """A lane this server does not serve."""


@dataclass
class EndOfLane:
    """Returned by :meth:`LaneHub.read` past a lane's last batch.

    ``tombstones``: records dropped after the lane's last batch (their ``closes`` and reason),
    which no batch carries."""

    next_seq: int
    chain: bytes
    tombstones: tuple[SampleMeta, ...] = ()

    @classmethod
    def of(cls, log: LaneLog) -> EndOfLane:
        """The end of a lane whose run has ended it."""
        return cls(log.next_seq, log.chain, tuple(log.tail_tombstones))


@dataclass
class _Lane:
    lane: int
    start_seq: int  # first seq this run can produce (resume position)
    batches: deque[SampleBatch] = field(default_factory=deque)
    next_seq: int = 0  # next seq the producer will add
    end: EndOfLane | None = None
    consumers: dict[str, int] = field(default_factory=dict)  # consumer -> acked next_seq
    acked: int = 0

    @property
    def first_seq(self) -> int:
        return self.batches[0].seq if self.batches else self.next_seq

    def slowest(self) -> int:
        return min(self.consumers.values()) if self.consumers else self.acked


class LaneHub:
    """Hosts a pipeline run for a set of lanes; see the module docstring."""

    def __init__(
        self,
        pipeline: Pipeline,
        execution: ExecutionConfig,
        *,
        lanes: Sequence[int] | None = None,
        store: CheckpointStore | None = None,
        max_ahead: int = 32,
        keep_consumed: int = 64,
        replay_cache: ReplayCache | None = None,
        checkpoint_key: CheckpointKey | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.execution = execution
        self.plan: Plan = pipeline.plan(execution)
        n = self.plan.pipeline.lanes
        self.lanes = sorted(set(lanes)) if lanes is not None else list(range(n))
        for lane in self.lanes:
            if not 0 <= lane < n:
                raise BadLane(f"lane {lane} does not exist; the pipeline has lanes 0..{n - 1}")
        self.store = store
        #: Signs the checkpoint bytes this hub hands out and verifies the ones it is given
        #: (the store signs what it saves with the same key).
        self.checkpoint_key = checkpoint_key
        self.replay_cache = replay_cache
        self.max_ahead = max_ahead
        self.keep_consumed = keep_consumed
        # One lock; the general condition wakes the producer's gate and checkpoint waiters,
        # each lane's condition only that lane's readers (no herd of every stream per batch).
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._lane_conds = {lane: threading.Condition(lock) for lane in self.lanes}
        self._resume_lock = threading.Lock()
        self._run: PipelineRun | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._generation = 0
        self._state: dict[int, _Lane] = {}
        self.resumed_from: str | None = None
        self.replays_started = 0
        self._manifest_saved = False
        #: Called with the error when the pipeline fails (a worker died, bad data under
        #: ``on_error: fail``...) and with ``None`` when a run starts; the server turns it
        #: into health NOT_SERVING / SERVING.
        self.on_failure: Callable[[BaseException | None], None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        return self.plan.fingerprint

    @property
    def num_lanes(self) -> int:
        return self.plan.pipeline.lanes

    @property
    def run(self) -> PipelineRun | None:
        return self._run

    @property
    def error(self) -> BaseException | None:
        """Why the current run failed, or None."""
        return self._error

    def start(self, resume: ResumeState | None = None) -> None:
        """Start producing (from the beginning, or from ``resume``'s positions)."""
        if resume is not None:
            self._check_compatible(resume)
        self._install(self._new_run(resume))

    def _check_compatible(self, state: ResumeState) -> None:
        """Refuse a checkpoint of another pipeline or other data, naming the changed shards
        from the shard manifest next to the checkpoint or in the state directory."""
        state.check_compatible(
            self.plan.fingerprint,
            self.plan.components,
            datasets=self.plan.datasets,
            manifest_dirs=[manifest_dir(self.store.dir)] if self.store is not None else [],
        )

    def _new_run(self, resume: ResumeState | None) -> PipelineRun:
        """A run of the served lanes; validates ``resume`` fully before anything changes."""
        try:
            return PipelineRun(
                self.plan,
                lanes=self.lanes,
                resume=resume,
                gate=self,
                replay_cache=self.replay_cache,
            )
        except ConfigError as exc:
            if resume is None:
                raise
            # The checksum matched, so the file was written like this: its lane state does
            # not describe this pipeline's work source.
            raise CorruptCheckpoint(f"checkpoint lane state is invalid: {exc}") from exc

    def _install(self, run: PipelineRun) -> None:
        with self._cond:
            self._run = run
            self._error = None
            self._generation += 1
            self._state = {}
            for lane in self.lanes:
                start = run.logs[lane].start.next_seq
                self._state[lane] = _Lane(lane, start, next_seq=start, acked=start)
            gen = self._generation
            self._wake_all()  # readers of the previous run end (HubClosed: reopen the lane)
            self._thread = threading.Thread(
                target=self._produce, args=(run, gen), name="zephon-hub-producer", daemon=True
            )
            self._thread.start()
        log.info("hub started: lanes %s from %s", self.lanes, self.positions())
        if self.on_failure is not None:
            self.on_failure(None)

    def stop(self) -> None:
        """Stop producing and wake every reader (they get :class:`HubClosed`)."""
        with self._cond:
            self._closed = True
            self._wake_all()
            run, thread = self._run, self._thread
        if run is not None:
            run.close()
        if thread is not None:
            thread.join(timeout=10)

    def resume(self, state: ResumeState, source: str = "") -> dict[int, int]:
        """Reset the engine to a checkpoint; returns the new per-lane positions.

        Everything is checked before the current run stops: a checkpoint that is rejected
        (another pipeline, missing lanes, invalid lane state) leaves the server serving.
        """
        with self._resume_lock:
            self._check_compatible(state)
            missing = [lane for lane in self.lanes if lane not in state.lanes]
            if missing:
                raise IncompatibleCheckpoint(
                    f"checkpoint has no state for lanes {missing} served here (expected lanes "
                    f"{self.lanes}, found {sorted(state.lanes)})"
                )
            run = self._new_run(state)
            self.stop()
            with self._cond:
                self._closed = False
            self._install(run)
            self.resumed_from = source or None
            return self.positions()

    # -- gate (called by the lane source on the producer side) ------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def ready(self, lane: int) -> bool:
        with self._cond:
            st = self._state.get(lane)
            return st is None or st.next_seq - st.slowest() < self.max_ahead

    def wait(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    # -- producer -------------------------------------------------------------------------

    def _produce(self, run: PipelineRun, generation: int) -> None:
        try:
            for item in run:
                with self._cond:
                    if generation != self._generation or self._closed:
                        return
                    st = self._state[item.lane_id]
                    if isinstance(item, SampleBatch):
                        st.batches.append(item)
                        st.next_seq = item.seq + 1
                        self._evict(st)
                    elif isinstance(item, LaneEnd):
                        st.end = EndOfLane.of(run.logs[item.lane_id])
                    self._lane_conds[item.lane_id].notify_all()
                    self._cond.notify_all()
            log.info("pipeline finished: every served lane ended")
        except BaseException as exc:
            log.exception("pipeline failed")
            with self._cond:
                current = generation == self._generation and not self._closed
                if current:
                    self._error = exc
                    self._wake_all()
            if current and self.on_failure is not None:
                self.on_failure(exc)

    def _evict(self, st: _Lane) -> None:
        keep_from = st.slowest() - self.keep_consumed
        while st.batches and st.batches[0].seq < keep_from:
            st.batches.popleft()

    # -- consumers ------------------------------------------------------------------------

    def _lane(self, lane: int) -> _Lane:
        st = self._state.get(lane)
        if st is None:
            raise BadLane(
                f"lane {lane} is not served here; this server serves lanes {self.lanes} "
                f"of {self.num_lanes}"
            )
        return st

    def reachable(self, lane: int) -> tuple[int, int]:
        """(oldest, newest) seqs a consumer may open at on ``lane`` right now."""
        with self._cond:
            st = self._lane(lane)
            return self._oldest(st), self._newest(st)

    def _newest(self, st: _Lane) -> int:
        # Everything produced is reachable (a reconnecting consumer may be past the slowest
        # one: its acks were lost with the connection), and up to max_ahead beyond the slowest.
        if st.end is not None:
            return st.end.next_seq
        return max(st.next_seq, st.slowest() + self.max_ahead)

    def _oldest(self, st: _Lane) -> int:
        assert self._run is not None
        history = self._run.logs[st.lane].history
        oldest = st.start_seq
        if history and history[0][0] + 1 > oldest and len(history) == history.maxlen:
            oldest = history[0][0] + 1
        return min(oldest, st.first_seq)

    def open(self, lane: int, consumer: str, start_seq: int) -> LaneReader:
        """A consumer's stream of ``lane`` from ``start_seq`` (raises OutOfRange / BadLane)."""
        with self._cond:
            st = self._lane(lane)
            oldest = self._oldest(st)
            newest = self._newest(st)
            if start_seq < oldest or start_seq > newest:
                when = "no longer" if start_seq < oldest else "not yet"
                raise OutOfRange(
                    f"lane {lane}: seq {start_seq} is {when} reachable; reachable range is "
                    f"{oldest}..{newest} (the server keeps {self.keep_consumed} consumed batches "
                    "and regenerates older ones from the last checkpointable position)"
                )
            generation = self._generation
            st.consumers[consumer] = start_seq
            replay = start_seq < st.first_seq
        if replay:
            return LaneReader(self._replay_stream(lane, consumer, start_seq, generation))
        return _LiveReader(self, lane, consumer, start_seq, generation)

    def ack(self, lane: int, consumer: str, next_seq: int) -> None:
        """Consumer ``consumer`` consumed every batch of ``lane`` below ``next_seq``."""
        with self._cond:
            st = self._lane(lane)
            if consumer in st.consumers and next_seq > st.consumers[consumer]:
                st.consumers[consumer] = next_seq
                st.acked = max(st.acked, next_seq)
                self._evict(st)
                self._cond.notify_all()

    def close_consumer(self, lane: int, consumer: str) -> None:
        """The consumer's stream ended: it no longer holds back eviction."""
        with self._cond:
            st = self._state.get(lane)
            if st is not None and st.consumers.pop(consumer, None) is not None:
                self._lane_conds[lane].notify_all()
                self._cond.notify_all()

    def _wake_all(self) -> None:
        """Wake every waiter (stop, failure, reset); the lock is held."""
        self._cond.notify_all()
        for cond in self._lane_conds.values():
            cond.notify_all()

    def _check(self, generation: int) -> None:
        problem = self._problem(generation)
        if problem is not None:
            raise problem

    def _problem(self, generation: int) -> BaseException | None:
        """Why a stream of ``generation`` cannot go on (the lock is held), or None."""
        if self._closed:
            return HubClosed("server is shutting down")
        if generation != self._generation:
            return HubClosed("the engine was reset by Resume; reopen the lane")
        return self._error

    def _replay_stream(
        self, lane: int, consumer: str, seq: int, generation: int
    ) -> Iterator[SampleBatch | EndOfLane]:
        assert self._run is not None
        state = self._run.checkpoint({lane: seq})
        self.replays_started += 1
        log.info(
            "lane %d: consumer %s replays from seq %d (boundary chunk %d)",
            lane,
            consumer,
            seq,
            state.lanes[lane].boundary_chunk,
        )
        run = PipelineRun(self.plan, lanes=[lane], resume=state, replay_cache=self.replay_cache)
        try:
            for item in run:
                self._check(generation)
                with self._cond:
                    if consumer not in self._state[lane].consumers:
                        return  # closed (the call was cancelled)
                if isinstance(item, SampleBatch):
                    yield item
                elif isinstance(item, LaneEnd):
                    yield EndOfLane.of(run.logs[lane])
                    return
        finally:
            run.close()

    # -- positions and checkpoints ----------------------------------------------------------

    def positions(self) -> dict[int, int]:
        """Acknowledged next_seq per lane (the slowest active consumer, else the last ack)."""
        with self._cond:
            return {lane: st.slowest() for lane, st in sorted(self._state.items())}

    def produced(self) -> dict[int, int]:
        with self._cond:
            return {lane: st.next_seq for lane, st in sorted(self._state.items())}

    def checkpoint(
        self, positions: dict[int, int] | None = None, tag: str = "", produce_timeout: float = 30.0
    ) -> tuple[str, bytes, ResumeState]:
        """Snapshot resume state (given positions override the acknowledged ones); persist.

        A position this run has not produced yet but will (within ``--max-ahead`` of the
        lane's slowest consumer, e.g. a trainer's position right after a restart from an older
        checkpoint) is waited for, up to ``produce_timeout`` seconds.
        """
        if self._run is None:
            raise CheckpointError("the hub is not running")
        merged = self.positions()
        for lane, seq in (positions or {}).items():
            self._lane(lane)
            merged[lane] = seq
        self._wait_produced(merged, timeout=produce_timeout)
        state = self._run.checkpoint(merged, tag=tag)
        if self.store is None:
            return "", state.encode(self.checkpoint_key), state
        if not self._manifest_saved:  # before the checkpoint: every checkpoint has its manifest
            manifest = ShardManifest.of(self.plan.fingerprint, self.plan.datasets)
            self._manifest_saved = save_manifest(manifest_dir(self.store.dir), manifest) is not None
        cid, data = self.store.save(state)
        return cid, data, state

    def _wait_produced(self, positions: dict[int, int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            generation = self._generation
            while not self._closed and self._error is None and generation == self._generation:
                pending = [
                    lane
                    for lane, seq in positions.items()
                    if (st := self._state[lane]).next_seq < seq
                    and st.end is None
                    and seq <= st.slowest() + self.max_ahead
                ]
                remaining = deadline - time.monotonic()
                if not pending or remaining <= 0:
                    return
                self._cond.wait(min(remaining, 0.5))

    def stats(self) -> dict[str, Any]:
        """Per-lane figures for metrics and progress logs."""
        with self._cond:
            lanes = {
                lane: {
                    "produced": st.next_seq,
                    "acked": st.slowest(),
                    "buffered": len(st.batches),
                    "consumers": len(st.consumers),
                    "ended": st.end is not None,
                }
                for lane, st in self._state.items()
            }
        run_stats = self._run.stats() if self._run is not None else {}
        return {"lanes": lanes, "run": run_stats, "time": time.time()}


class LaneReader(Iterator["SampleBatch | EndOfLane"]):
    """One consumer's stream of a lane (:meth:`LaneHub.open`): its batches in seq order, then
    an :class:`EndOfLane`. Iterating blocks until the next item exists; :meth:`ready` takes
    the batches that already do without waiting (a replayed stream has none ready: it
    regenerates them one by one)."""

    def __init__(self, items: Iterator[SampleBatch | EndOfLane]) -> None:
        self._items = items

    def __next__(self) -> SampleBatch | EndOfLane:
        return next(self._items)

    def ready(
        self, limit: int, max_bytes: int | None = None, linger: float = 0.0
    ) -> list[SampleBatch]:
        """Up to ``limit`` next batches that are produced already, while their tensors add up
        to at most ``max_bytes``. With ``linger`` > 0 it first waits up to that many seconds
        for ``limit`` batches to exist (less when the lane ends, the stream closes or the
        run fails); otherwise it never waits."""
        return []


class _LiveReader(LaneReader):
    """A consumer's stream of the batches the hub's run produces."""

    def __init__(self, hub: LaneHub, lane: int, consumer: str, seq: int, generation: int) -> None:
        self._hub = hub
        self._lane = lane
        self._consumer = consumer
        self._seq = seq
        self._generation = generation
        self._done = False

    def __next__(self) -> SampleBatch | EndOfLane:
        if self._done:
            raise StopIteration
        hub, lane = self._hub, self._lane
        with hub._cond:
            while True:
                hub._check(self._generation)
                st = hub._state[lane]
                seq = self._seq
                if st.batches and st.first_seq <= seq < st.next_seq:
                    self._seq += 1
                    return st.batches[seq - st.first_seq]
                if st.end is not None and seq >= st.end.next_seq:
                    self._done = True
                    return st.end
                if seq < st.first_seq:
                    raise OutOfRange(f"lane {lane}: seq {seq} was evicted")
                if self._consumer not in st.consumers:
                    self._done = True  # closed (the call was cancelled) while waiting
                    raise StopIteration
                hub._lane_conds[lane].wait(0.5)

    def ready(
        self, limit: int, max_bytes: int | None = None, linger: float = 0.0
    ) -> list[SampleBatch]:
        hub = self._hub
        out: list[SampleBatch] = []
        budget = float("inf") if max_bytes is None else max_bytes
        with hub._cond:
            st = hub._state[self._lane]
            if linger > 0:
                self._linger(st, limit, time.monotonic() + linger)
            if self._done or hub._problem(self._generation) is not None:
                return out  # the next __next__ reports it
            while len(out) < limit and st.batches and st.first_seq <= self._seq < st.next_seq:
                batch = st.batches[self._seq - st.first_seq]
                budget -= batch.nbytes()
                if budget < 0:
                    break
                out.append(batch)
                self._seq += 1
        return out

    def _linger(self, st: _Lane, count: int, deadline: float) -> None:
        """Wait (holding the hub's lock) until ``count`` batches past this reader's position
        are produced, or until ``deadline``, the lane's end, the consumer's close or a run
        problem, whichever comes first."""
        hub = self._hub
        while (
            st.next_seq - self._seq < count
            and st.end is None
            and self._consumer in st.consumers
            and hub._problem(self._generation) is None
        ):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            hub._lane_conds[self._lane].wait(left)
