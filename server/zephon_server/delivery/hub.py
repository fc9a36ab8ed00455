"""The lane hub: one pipeline run shared by every consumer of a server's lanes.

The hub runs the pipeline on a producer thread and keeps, per lane, a log of recent batches.
Consumers read by absolute seq; several consumers of one lane (tensor/pipeline-parallel
peers) get the identical batch objects, computed once. A consumer asking for a seq the log no
longer holds is served by a shared *replay* (:mod:`.replays`) regenerated from that lane's
nearest epoch boundary, and handed back to the log once it holds the consumer's seq again.

Memory is bounded per lane, in two steps:

* the gate: the source stops feeding a lane once it is ``max_ahead`` batches ahead of its
  slowest consumer (or, with none, of its last acknowledged position), so a slow consumer
  holds back only its own lane;
* the producer: the work already in flight can still make any number of batches (one huge
  document packs into thousands), so the producer thread waits before adding a batch to a
  lane that holds ``limit = max_ahead + headroom(max_ahead)`` unconsumed batches, until an
  ack, a consumer leaving, a stop or a resume makes room. The pipeline's queues are bounded,
  so everything in flight stops with it, and the other lanes of the run wait too (they share
  one pipeline). Except when another lane has a reader (or a checkpoint) waiting for a batch:
  that wait might never end (a trainer reads its lanes in turn), so the full lane keeps its
  batches instead, up to ``cap = limit + overflow(max_ahead)``; past that, its batches are
  *not kept* (their digests still chain) and whoever reads them gets them from a replay.

With ``end_of_data: shortest`` readers are also gated by the lanes' *frontier*
(:mod:`.end_gate`): seq ``s`` goes out once every lane has produced it, and a reader waiting on
it counts as demand for the lanes it waits for. The call sites are marked ``end_of_data:``.

A lane's log is therefore one contiguous run of batches, possibly followed by a *gap* of
batches not kept (up to ``next_seq``); nothing is kept past a gap, and the log starts afresh
once no live consumer reads before it. Consumed batches are kept ``keep_consumed`` deep for
quick reconnects. With replays off (``max_replays=0``) nothing could be regenerated, so a
full lane keeps its batches instead of leaving a gap (bounded by the work in flight only).

The hub never imports gRPC; the service adapts it to the protocol.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..engine.checkpoint import (
    CheckpointError,
    CheckpointStore,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    ResumeState,
)
from ..engine.checkpoint_key import CheckpointKey
from ..engine.errors import ConfigError, ZephonError
from ..engine.execution import ExecutionConfig
from ..engine.manifest import ShardManifest, manifest_dir, save_manifest
from ..engine.numbered_batch import NumberedBatch
from ..engine.pipeline import Pipeline
from ..engine.planner import Plan
from ..engine.records import LaneEnd
from ..engine.replay_cache import ReplayCache
from ..engine.run import EndOfLane, PipelineRun
from .end_gate import EndGate
from .lane_buffer import LaneBuffer
from .readers import LaneReader
from .replays import ReplayLimit, ReplayPool, SharedReplay

log = logging.getLogger(__name__)

__all__ = [
    "BadLane",
    "EndOfLane",
    "HubClosed",
    "LaneHub",
    "LaneReader",
    "OutOfRange",
    "ReplayLimit",
    "headroom",
    "overflow",
]


def headroom(max_ahead: int) -> int:
    """Batches a lane's log may hold beyond ``max_ahead`` before the producer waits: the gate
    stops feeding a lane at ``max_ahead``, and the chunks already in flight usually add a few
    batches more; waiting only past this headroom keeps the producer from stopping for them."""
    return max(8, max_ahead // 2)


def overflow(max_ahead: int) -> int:
    """Batches a full lane's log may grow by while another lane waits for the pipeline, before
    its batches are not kept: enough for a chunk or two of ordinary documents in flight (a
    trainer reading its lanes in turn keeps every lane busy), bounded for a huge one."""
    return max(256, 4 * max_ahead)


class OutOfRange(ZephonError):
    """A seq that is no longer, or not yet, reachable on a lane."""


class HubClosed(ZephonError):
    """The hub is stopping (drain) or was reset by a resume."""


class BadLane(ZephonError, ValueError):
    """A lane this server does not serve."""


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
        max_replays: int | None = None,
    ) -> None:
        if isinstance(max_ahead, bool) or not isinstance(max_ahead, int) or max_ahead < 1:
            raise ConfigError(f"max_ahead (--max-ahead) must be an integer >= 1, got {max_ahead!r}")
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
        #: Unconsumed batches a lane's log holds at most while no other lane needs a batch...
        self.limit = max_ahead + headroom(max_ahead)
        #: ...and at all (with replays on): past it, batches are not kept.
        self.cap = self.limit + overflow(max_ahead)
        self.keep_consumed = keep_consumed
        self._replays = ReplayPool.serving(len(self.lanes), max_replays)
        # One lock; the general condition wakes the producer and checkpoint waiters, each
        # lane's condition only that lane's readers (no herd of every stream per batch), each
        # replay's condition only its readers and its producer.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._lane_conds = {lane: threading.Condition(self._lock) for lane in self.lanes}
        self._resume_lock = threading.Lock()
        self._run: PipelineRun | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._generation = 0
        self._state: dict[int, LaneBuffer] = {}
        self._blocked: int | None = None  # the lane whose full log the producer waits on
        self._blocked_since = 0.0  # since when (time.monotonic())
        #: end_of_data: the frontier of the current run (None: each lane to its own end).
        self.end_gate: EndGate | None = None
        self.producer_waits = 0
        self.resumed_from: str | None = None
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

    def current_run(self) -> tuple[int, PipelineRun | None]:
        """The run and its generation (one more at every run installed: start, Resume)."""
        with self._cond:
            return self._generation, self._run

    @property
    def error(self) -> BaseException | None:
        """Why the current run failed, or None."""
        return self._error

    @property
    def replays_started(self) -> int:
        """Replays started since the hub was made (each one regeneration, shared)."""
        return self._replays.started

    @property
    def max_replays(self) -> int:
        return self._replays.limit

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
                checkpoint_floor=self._checkpoint_floor,
                apply_end=False,  # end_of_data: the hub gates its readers itself
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
                self._state[lane] = LaneBuffer(lane, start, next_seq=start, acked=start)
            self.end_gate = EndGate.of(
                run, self.lanes, self._state, self._lane_conds, self._wake_all
            )
            gen = self._generation
            if self.end_gate is not None:  # lanes promised batches let seqs out sooner
                run.on_promise = functools.partial(self._on_promise, gen)
            self._wake_all()  # readers of the previous run end (HubClosed: reopen the lane)
            self._thread = threading.Thread(
                target=self._produce, args=(run, gen), name="zephon-hub-producer", daemon=True
            )
            self._thread.start()
        log.info("hub started: lanes %s from %s", self.lanes, self.positions())
        if self.on_failure is not None:
            self.on_failure(None)

    def stop(self) -> None:
        """Stop producing and replaying; wake every reader (they get :class:`HubClosed`)."""
        with self._cond:
            self._closed = True
            self._wake_all()
            run, thread = self._run, self._thread
            replays = self._replays.close_all()
        for replay in replays:
            replay.stop()
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
            gate = self.end_gate  # end_of_data: a lane the frontier waits for, or a cut tail
            if st is not None and gate is not None and (gate.wanted(lane) or gate.past_end(st)):
                return True
            return st is None or st.next_seq - st.slowest() < self.max_ahead

    def wait(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    def _checkpoint_floor(self, lane: int) -> int | None:
        """The oldest position a checkpoint of ``lane`` may still be taken at (the replay
        cache keeps the epochs from there): its slowest consumer's, replays included."""
        with self._cond:
            st = self._state.get(lane)
            return None if st is None or self._closed else st.position()

    # -- producer -------------------------------------------------------------------------

    def _on_promise(self, generation: int, lane: int, batches: int) -> None:
        """``lane`` of the run of ``generation`` will produce ``batches`` batches at least
        (called from the pipeline's counting thread: :mod:`..engine.lane_promises`)."""
        with self._cond:
            if self._current(generation) and self.end_gate is not None:
                self.end_gate.promise(lane, batches)

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._closed

    def _produce(self, run: PipelineRun, generation: int) -> None:
        try:
            for item in run:
                with self._cond:
                    if not self._current(generation):
                        return
                    st = self._state[item.lane_id]
                    if self.end_gate is not None and not self.end_gate.report(item, run):
                        continue  # end_of_data: a batch past the final end (cut)
                    if isinstance(item, NumberedBatch):
                        keep = self._keep(st, generation)
                        if keep is None:
                            return
                        st.next_seq = item.seq + 1
                        if keep:
                            st.batches.append(item)
                        else:
                            st.dropped += 1
                        st.dropping = not keep
                        self._evict(st)
                    elif isinstance(item, LaneEnd):
                        st.end = EndOfLane.of(run.logs[item.lane_id])
                    self._lane_conds[item.lane_id].notify_all()
                    self._cond.notify_all()
            log.info("pipeline finished: every served lane ended")
        except BaseException as exc:
            log.exception("pipeline failed")
            with self._cond:
                current = self._current(generation)
                if current:
                    self._error = exc
                    self._wake_all()
            if current and self.on_failure is not None:
                self.on_failure(exc)

    def _full(self, st: LaneBuffer) -> bool:
        return st.next_seq - st.slowest() >= self.limit

    def _needed_elsewhere(self, lane: int) -> int | None:
        """Another lane with a reader or checkpoint waiting for its next batch, which the
        pipeline can give it (its log is not full): waiting for ``lane``'s consumers then
        might never end. None if there is none."""
        wanted = self.end_gate.any_wanted() if self.end_gate is not None else None
        if wanted is not None:
            return wanted  # end_of_data: a reader waits on the frontier for that lane
        for key, other in self._state.items():
            if key != lane and other.waiting and other.end is None and not self._full(other):
                return key
        return None

    def _keep(self, st: LaneBuffer, generation: int) -> bool | None:
        """Whether the producer's next batch of ``st`` goes into the log (the lock is held;
        waiting releases it). While the log is full it waits, until an ack, a consumer
        leaving, a stop or a resume makes room. When another lane needs a batch meanwhile it
        keeps the batch, up to ``cap`` unconsumed ones; past that the batch is not kept
        (False). None when this run is stopping."""
        since = time.monotonic()
        told = False
        try:
            while self._current(generation):
                gapless = st.kept_end == st.next_seq  # nothing is kept past a gap
                if not self._full(st):
                    return gapless
                needy = self._needed_elsewhere(st.lane)
                if needy is not None:
                    unconsumed = st.next_seq - st.slowest()
                    if gapless and (unconsumed < self.cap or not self._replays.limit):
                        return True  # (with replays off nothing could regenerate it)
                    if not st.dropping:
                        log.info(
                            "lane %d: %d batches not acknowledged while lane %d waits for the "
                            "pipeline: the next ones are not kept (a lane holds at most %d "
                            "then); its readers get them from a replay",
                            st.lane,
                            unconsumed,
                            needy,
                            self.cap,
                        )
                    return False
                if self._blocked is None:
                    self._blocked = st.lane
                    self._blocked_since = since
                    self.producer_waits += 1
                if not told and time.monotonic() - since > 10:
                    told = True
                    log.info(
                        "lane %d holds back the pipeline: %d batches not acknowledged (the "
                        "most a lane holds is --max-ahead %d + %d); its consumers are at %s",
                        st.lane,
                        st.next_seq - st.slowest(),
                        self.max_ahead,
                        self.limit - self.max_ahead,
                        sorted(st.consumers.values()) or f"none (acknowledged {st.acked})",
                    )
                self._cond.wait(0.5)
            return None
        finally:
            if self._blocked is not None:
                self._blocked = None
                st.held_s += time.monotonic() - since

    def _await_batch(self, st: LaneBuffer, cond: threading.Condition, timeout: float) -> None:
        """A reader (the lock held) waits for ``st``'s next batch: it counts as demand that a
        waiting producer must not ignore (see :meth:`_needed_elsewhere`)."""
        st.waiting += 1
        if self._blocked is not None:
            self._cond.notify_all()
        try:
            cond.wait(timeout)
        finally:
            st.waiting -= 1

    def _evict(self, st: LaneBuffer) -> None:
        st.evict(self.keep_consumed)

    # -- consumers ------------------------------------------------------------------------

    def _lane(self, lane: int) -> LaneBuffer:
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

    def _newest(self, st: LaneBuffer) -> int:
        # Everything produced is reachable (a reconnecting consumer may be past the slowest
        # one: its acks were lost with the connection), and up to max_ahead beyond the slowest.
        if st.end is not None:
            return st.end.next_seq
        return max(st.next_seq, st.slowest() + self.max_ahead)

    def _oldest(self, st: LaneBuffer) -> int:
        if not self._replays.limit:
            return st.first_seq  # replays are off: only the log
        assert self._run is not None
        history = self._run.logs[st.lane].history
        oldest = st.start_seq
        if history and history[0][0] + 1 > oldest and len(history) == history.maxlen:
            oldest = history[0][0] + 1
        return min(oldest, st.first_seq)

    def open(self, lane: int, consumer: str, start_seq: int) -> LaneReader:
        """A consumer's stream of ``lane`` from ``start_seq``; raises OutOfRange / BadLane, or
        :class:`ReplayLimit` when the seq needs one replay more than ``max_replays``."""
        with self._cond:
            st = self._lane(lane)
            oldest = self._oldest(st)
            newest = self._newest(st)
            if start_seq > newest and st.end is not None:
                raise OutOfRange(self._past_end(lane, start_seq, newest))
            if start_seq < oldest or start_seq > newest:
                when = "no longer" if start_seq < oldest else "not yet"
                older = (
                    "regenerates older ones from the last checkpointable position"
                    if self._replays.limit
                    else "replays are off (--max-replays 0)"
                )
                raise OutOfRange(
                    f"lane {lane}: seq {start_seq} is {when} reachable; reachable range is "
                    f"{oldest}..{newest} (the server keeps {self.keep_consumed} consumed batches "
                    f"and {older})"
                )
            generation = self._generation
            if st.holds(start_seq) or start_seq >= st.next_seq:
                st.consumers[consumer] = start_seq
            else:
                self._join_replay(st, consumer, start_seq, start_seq)
            st.remember(consumer, start_seq)
        return LaneReader(self, lane, consumer, start_seq, generation)

    def _past_end(self, lane: int, seq: int, last: int) -> str:
        """What to say of a seq past a lane that ended (at the common end, if there is one)."""
        gate = self.end_gate
        common = gate.ends.end if gate is not None else None
        where = (
            f"seq {common}, the common end of every lane (end_of_data: shortest)"
            if common is not None
            else f"seq {last}"
        )
        return f"lane {lane}: seq {seq} is past the lane's end: it ends at {where}"

    def _join_replay(
        self, st: LaneBuffer, consumer: str, seq: int, acked: int, forced: bool = False
    ) -> None:
        """Make ``consumer`` (acknowledged up to ``acked``) a reader of a replay serving
        ``seq`` (the lock is held): one that has not passed it, else a new one from the first
        cut of its epoch. ``forced``: a live reader whose next batch was not kept, which
        always gets its replay (``max_replays`` limits streams opened at older seqs)."""
        assert self._run is not None
        run, lane = self._run, st.lane
        try:
            boundary, first = run.epoch_start(lane, seq)
        except CheckpointError as exc:
            raise OutOfRange(f"lane {lane}: seq {seq} is no longer reachable ({exc})") from exc
        replay = self._replays.find(lane, seq, boundary)
        if replay is None:
            if not forced:
                self._replays.admit(lane, seq, boundary)
            replay = self._start_replay(lane, first, boundary)
            log.info(
                "lane %d: replay from seq %d (epoch boundary chunk %d) started for consumer %s "
                "at seq %d",
                lane,
                first,
                boundary,
                consumer,
                seq,
            )
        else:
            log.debug(
                "lane %d: consumer %s at seq %d joins the replay from seq %d",
                lane,
                consumer,
                seq,
                replay.start_seq,
            )
        replay.add_reader(consumer, seq)
        st.replaying[consumer] = replay
        st.replay_acked[consumer] = acked

    def _start_replay(self, lane: int, first: int, boundary: int) -> SharedReplay:
        """A replay of ``lane`` from position ``first`` (epoch ``boundary``), started (the lock
        is held; its run is built on its own thread)."""
        assert self._run is not None
        state = self._run.checkpoint({lane: first})
        replay = SharedReplay(
            lane,
            first,
            boundary,
            k=self.plan.pipeline.flush_every_k_chunks,
            window=self.limit,
            lock=self._lock,
            make_run=lambda: PipelineRun(
                self.plan,
                lanes=[lane],
                resume=state,
                retention=16,
                replay_cache=self.replay_cache,
                checkpoint_floor=_keep_everything,
                release_shared_memory=False,  # the hub's run owns the process's blocks
            ),
            on_finished=self._replay_finished,
        )
        self._replays.add(replay)
        replay.start()
        return replay

    def _to_replay(self, st: LaneBuffer, consumer: str, seq: int) -> SharedReplay:
        """A live reader's next batch is not in the log (not kept, or evicted): it reads a
        replay from now on (the lock is held)."""
        if not self._replays.limit:  # never happens: without replays every batch is kept
            raise OutOfRange(f"lane {st.lane}: seq {seq} is not kept (--max-replays 0)")
        acked = st.consumers.pop(consumer)
        try:
            self._join_replay(st, consumer, seq, acked, forced=True)
        except BaseException:
            st.consumers[consumer] = acked
            raise
        self._evict(st)
        self._cond.notify_all()  # one live consumer less: the log may have room
        return st.replaying[consumer]

    def _replay_finished(self, replay: SharedReplay) -> None:
        with self._cond:
            self._replays.finished(replay)

    def _hand_over(self, st: LaneBuffer, consumer: str, replay: SharedReplay, seq: int) -> bool:
        """Move a replay reader at ``seq`` to the live log when the log holds that seq again
        (the lock is held); True when it did."""
        if not (st.first_seq <= seq < st.kept_end or seq == st.next_seq == st.kept_end):
            return False
        del st.replaying[consumer]
        st.consumers[consumer] = st.replay_acked.pop(consumer)
        self._replays.leave(consumer, replay)  # its last reader gone: it stops by itself
        self._replays.forget_closed()
        log.debug(
            "lane %d: consumer %s continues from the live log at seq %d", st.lane, consumer, seq
        )
        return True

    def ack(self, lane: int, consumer: str, next_seq: int) -> None:
        """Consumer ``consumer`` consumed every batch of ``lane`` below ``next_seq``."""
        with self._cond:
            st = self._lane(lane)
            if consumer in st.consumers and next_seq > st.consumers[consumer]:
                st.consumers[consumer] = next_seq
                st.acked = max(st.acked, next_seq)
                self._evict(st)
                self._cond.notify_all()
            elif consumer in st.replay_acked and next_seq > st.replay_acked[consumer]:
                st.replay_acked[consumer] = next_seq
                st.acked = max(st.acked, next_seq)
            else:
                return
            st.remember(consumer, next_seq)
            for replay in set(st.replaying.values()):
                replay.cond.notify_all()  # their readers may be at the lane's bound

    def close_consumer(self, lane: int, consumer: str) -> None:
        """The consumer's stream ended: it no longer holds back eviction (or its replay)."""
        stop: SharedReplay | None = None
        with self._cond:
            st = self._state.get(lane)
            if st is None:
                return
            found = st.consumers.pop(consumer, None) is not None
            replay = st.replaying.pop(consumer, None)
            if replay is not None:
                found = True
                st.replay_acked.pop(consumer, None)
                if self._replays.leave(consumer, replay):
                    stop = replay
                self._replays.forget_closed()
            if found:
                self._lane_conds[lane].notify_all()
                self._cond.notify_all()
        if stop is not None:
            stop.stop()  # its runner threads end now, not at its next batch

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

    # -- positions and checkpoints ----------------------------------------------------------

    def positions(self, consumer: str = "") -> dict[int, int]:
        """Acknowledged next_seq per lane (the slowest active consumer, else the last ack);
        for ``consumer``, its own: where it last acknowledged or opened in this run, else
        where the run started (a peer of a tensor-parallel group that connects late reads
        what the others read, not from where they are)."""
        with self._cond:
            if consumer:
                return {
                    lane: st.known.get(consumer, st.start_seq)
                    for lane, st in sorted(self._state.items())
                }
            return {lane: st.position() for lane, st in sorted(self._state.items())}

    def produced(self) -> dict[int, int]:
        with self._cond:
            return {lane: st.next_seq for lane, st in sorted(self._state.items())}

    def common_end(self) -> int | None:
        """The seq every lane ends at (``end_of_data: shortest`` on a finite stream) once it
        is final (:attr:`.lane_ends.LaneEnds.end`); None before, and when no common end applies."""
        with self._cond:
            gate = self.end_gate
            return gate.ends.end if gate is not None else None

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
        state = self._run.checkpoint(merged, tag=tag, end=self.common_end())
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
            marked: set[int] = set()  # lanes whose ``waiting`` this checkpoint raised
            states = dict(self._state)
            try:
                while not self._closed and self._error is None and generation == self._generation:
                    pending = {
                        lane
                        for lane, seq in positions.items()
                        if (st := states[lane]).next_seq < seq
                        and st.end is None
                        and seq <= st.slowest() + self.max_ahead
                    }
                    remaining = deadline - time.monotonic()
                    if not pending or remaining <= 0:
                        return
                    for lane in pending - marked:
                        states[lane].waiting += 1  # demand: a waiting producer goes on
                    for lane in marked - pending:
                        states[lane].waiting -= 1
                    marked = pending
                    self._cond.notify_all()
                    self._cond.wait(min(remaining, 0.5))
            finally:
                for lane in marked:
                    states[lane].waiting -= 1

    def stats(self) -> dict[str, Any]:
        """Per-lane figures for metrics and progress logs."""
        now = time.monotonic()
        with self._cond:
            end_of_data = self.end_gate.stats() if self.end_gate is not None else None
            ends = end_of_data or {}
            cut, made, end = ends.get("cut", {}), ends.get("produced", {}), ends.get("end")
            held = now - self._blocked_since  # the wait going on counts too
            lanes = {
                lane: st.stats(made.get(lane, 0), cut.get(lane, 0), end)
                | {"held_back_s": st.held_s + (held if self._blocked == lane else 0.0)}
                for lane, st in self._state.items()
            }
            replays = self._replays.stats()
            waiting_on = self._blocked
        run_stats = self._run.stats() if self._run is not None else {}
        return {
            "lanes": lanes,
            "run": run_stats,
            "replays": replays,
            "producer_waiting_on": waiting_on,
            "end_of_data": end_of_data,
            "time": time.time(),
        }


def _keep_everything(lane: int) -> None:
    """A replay run's ``checkpoint_floor``: it never evicts the replay cache."""
    return None
