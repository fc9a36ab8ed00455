"""Running a plan: source → stages → per-lane output log.

:class:`PipelineRun` wires a :class:`LaneSource` through one runner per stage and numbers
each lane's batches (``seq``), computing content and chain digests. Iterating it yields
:class:`NumberedBatch` values (with rows) and one :class:`LaneEnd` per lane; the tombstones
that reach the end of a lane without a batch are kept in ``lane_tail_tombstones``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_wire import CHAIN_SEED

from .checkpoint import CheckpointError, IncompatibleCheckpoint, LaneState, ResumeState
from .errors import ConfigError
from .lane_ends import LaneEnds, applies, deliver
from .lane_promises import LanePromises, counting_step
from .numbered_batch import NumberedBatch
from .ops.replay import REPLAY_CURSORS, ReplayFilterAccumulator
from .planner import Plan
from .records import Cursor, FlushSentinel, LaneEnd, SampleBatch, SampleMeta
from .replay_cache import REPLAY_CACHE, ReplayCache
from .runners.base import StageRunner
from .runners.inline import InlineRunner
from .runners.steps import StepDriver
from .runners.threads import ThreadsRunner
from .source import LaneGate, LaneSource
from .token_counts import count_batch_tokens
from .work_source import WorkSource

log = logging.getLogger(__name__)

#: At most this many chunks of a lane starting at an epoch boundary are fed before the other
#: lanes get theirs (bounds how long one lane's first batch can hold back the next lane's).
FIRST_BATCH_CHUNKS = 4

#: Tombstone reasons that mean "a bad record was skipped" (``on_error: skip``): it could not
#: be decoded, read or tokenized, or it is larger than the dataset's ``max_document_bytes``;
#: or (``render_chat``) its chat could not be rendered, or its loss mask would be all zeros,
#: all ones, or cut to zeros by ``max_length``.
SKIP_REASONS = (
    "malformed",
    "read_error",
    "tokenize_error",
    "too_large",
    "chat_error",
    "mask_empty",
    "mask_full",
    "mask_truncated",
)


def make_runner(
    kind: str, drivers: list[StepDriver], plan: Plan, extras: dict[str, Any] | None = None
) -> StageRunner:
    """The stage runner for ``kind``; ``extras`` reach the operators' contexts in workers."""
    ex = plan.execution
    kwargs: dict[str, Any] = {
        "workers": ex.workers,
        "ordered": ex.deterministic,
        "queue_depth": ex.queue_depth,
    }
    if kind == "inline":
        return InlineRunner(drivers, **kwargs)
    if kind == "threads":
        return ThreadsRunner(drivers, **kwargs)
    if kind == "processes":
        from .runners.processes import ProcessesRunner

        return ProcessesRunner(drivers, plan=plan, extras=extras, **kwargs)
    if kind == "ray":
        from .runners.ray import RayRunner

        return RayRunner(drivers, plan=plan, extras=extras, **kwargs)
    raise ConfigError(f"unknown runner {kind!r}")


class LaneLog:
    """Numbers a lane's batches, chains their digests, and remembers recent cut points.

    ``history`` keeps, for the last ``retention`` batches, the replay cursor and chain after
    each batch, so the run can checkpoint at any recently produced position.
    """

    __slots__ = ("chain", "ended", "history", "lane", "next_seq", "start", "tail_tombstones")

    def __init__(self, lane: int, start: LaneState, retention: int = 4096) -> None:
        self.lane = lane
        self.start = start
        self.next_seq = start.next_seq
        self.chain = start.chain
        self.history: deque[tuple[int, Cursor, bytes]] = deque(maxlen=retention)
        self.tail_tombstones: list[SampleMeta] = []
        self.ended = False

    def add(self, batch: SampleBatch) -> NumberedBatch:
        """Number ``batch`` as the lane's next seq, chained to the previous one."""
        numbered = NumberedBatch.number(batch, self.next_seq, self.chain)
        self.chain = numbered.chain_digest
        self.history.append((numbered.seq, batch.rows[-1].cursor, numbered.chain_digest))
        self.next_seq += 1
        return numbered

    def cut(self, next_seq: int) -> tuple[Cursor | None, bytes] | None:
        """(replay cursor, chain) after batch ``next_seq - 1``; None if not retained."""
        if next_seq == self.start.next_seq:
            return self.start.replay_cursor, self.start.chain
        if not self.history or not self.history[0][0] <= next_seq - 1 <= self.history[-1][0]:
            return None
        seq, cursor, chain = self.history[next_seq - 1 - self.history[0][0]]
        assert seq == next_seq - 1
        return cursor, chain


@dataclass(frozen=True)
class EndOfLane:
    """What a reader gets past a lane's last batch.

    ``tombstones``: records dropped after the lane's last batch (their ``closes`` and reason),
    which no batch carries."""

    next_seq: int
    chain: bytes
    tombstones: tuple[SampleMeta, ...] = ()

    @classmethod
    def of(cls, log: LaneLog) -> EndOfLane:
        """The end of a lane whose run has ended it."""
        return cls(log.next_seq, log.chain, tuple(log.tail_tombstones))


def _run_lanes(lanes: Sequence[int] | None, resume: ResumeState | None, n: int) -> list[int]:
    """The lanes a run serves, ascending: those given, else the resumed ones, else all
    ``n`` (:class:`ConfigError` for a lane that does not exist)."""
    if lanes is None:
        lanes = sorted(resume.lanes) if resume is not None else range(n)
    chosen = sorted(set(lanes))
    for lane in chosen:
        if not 0 <= lane < n:
            raise ConfigError(f"lane {lane} does not exist; lanes are 0..{n - 1}")
    return chosen


class PipelineRun:
    """One execution of a plan over a set of lanes; iterate for batches and lane ends.

    ``checkpoint_floor(lane)`` gives the oldest position (next_seq) a checkpoint of the lane
    may still be taken at (the hub: its slowest consumer's acknowledged position); the replay
    cache keeps ``keep_epochs`` epochs before that position's epoch boundary. Without it the
    boundary is the chunk the source starts (an in-process consumer is where the run is);
    returning None keeps everything (a replay run, which is behind the run that evicts).

    ``release_shared_memory``: whether :meth:`close` unlinks the process's shared-memory blocks
    (processes runner). A run beside another one in the same process (a replay next to the
    hub's run) passes False: the blocks are the process's, and releasing them would break the
    other run's payloads in flight; what it leaves is released when the main run closes.

    ``end_of_data``: with the pipeline's ``shortest`` and every lane in the run, iterating
    applies the common end (:func:`.lane_ends.deliver`: batches held until every lane has
    produced their seq, the cut ones dropped, ``ends`` counts them). A run of some lanes
    cannot know the others' ends and yields its lanes to their own ends, as does a run made
    with ``apply_end=False`` (the hub's, which applies the end to its readers itself).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        lanes: Sequence[int] | None = None,
        resume: ResumeState | None = None,
        max_chunks_per_lane: int | None = None,
        retention: int = 4096,
        gate: LaneGate | None = None,
        replay_cache: ReplayCache | None = None,
        checkpoint_floor: Callable[[int], int | None] | None = None,
        release_shared_memory: bool = True,
        apply_end: bool = True,
    ) -> None:
        self.plan = plan
        p = plan.pipeline
        self.lanes = _run_lanes(lanes, resume, p.lanes)
        self.work_source = WorkSource(
            plan.datasets, seed=p.seed, lanes=p.lanes, chunk_size=p.chunk_size
        )
        self.max_chunks_per_lane = max_chunks_per_lane
        self.gate = gate
        self.checkpoint_floor = checkpoint_floor
        self.release_shared_memory = release_shared_memory
        self._lock = threading.Lock()  # lane logs: producer appends, checkpoints read
        self.k = p.flush_every_k_chunks
        starts = self._starts(resume)
        self.logs = {lane: LaneLog(lane, starts[lane], retention) for lane in self.lanes}
        #: Whether the lanes end together (``shortest``, a finite stream, every lane here).
        self.end_together = applies(p, self.lanes)
        #: ``(lane, batches)``: a lane is promised at least that many batches
        #: (:mod:`.lane_promises`); set by the hub before iterating, which gates its readers
        #: on the lanes' frontier. None: nothing is counted.
        self.on_promise: Callable[[int, int], None] | None = None
        #: The common end applied by iteration (None: each lane runs to its own end).
        self.ends: LaneEnds | None = None
        if apply_end and self.end_together:
            self.ends = LaneEnds(
                p.end_of_data, {lane: (s.next_seq, s.chain) for lane, s in starts.items()}
            )
        #: Resumed lanes -> end (exclusive) of the chunks they replay: the end of the epoch of
        #: the replay cursor's chunk (the cursor's row may leave the shuffle that late).
        self.replay_ends = {
            lane: self._epoch_end(int(log.start.replay_cursor[0]))
            for lane, log in self.logs.items()
            if log.start.replay_cursor is not None
        }
        self._delivered_lanes: set[int] = set()  # lanes with a batch out (the source reads)
        self.replay_cache = (
            None
            if replay_cache is None
            else replay_cache.bind(plan.fingerprint, replay_ends=self.replay_ends)
        )
        self.runners: list[StageRunner] = []
        self.drivers: list[StepDriver] = []
        self.started = time.monotonic()
        self.batches_out = 0
        self.tokens_out = 0
        self.tombstones: Counter[tuple[str, str]] = Counter()  # (dataset, reason) -> count
        self.dataset_tokens: Counter[int] = Counter()  # dataset index -> tokens delivered
        self.dataset_loss_tokens: Counter[int] = Counter()  # dataset index -> trained tokens

    def _epoch_end(self, chunk: int) -> int:
        return (chunk // self.k + 1) * self.k if self.k else chunk + 1

    def _first_batch_priority(self, targets: dict[int, tuple[int, ...]]) -> dict[int, int]:
        """Lane -> the chunk id before which the source feeds it first (see LaneSource).

        Every lane is fed first, one at a time in lane order, until its first batch is out, so
        the first batch a trainer asks for waits for its own lane's chunks, not for a round of
        every lane's. A resumed lane gets at most the chunk after its replay cursor's (cached,
        then usually enough); a lane starting at an epoch boundary (a fresh start) at most
        :data:`FIRST_BATCH_CHUNKS` chunks. A lane that needs more gets it in the
        round-robin after. The order lanes are fed in never changes a lane's stream.

        Fresh lanes are put first only under a gate (a server's hub: readers wait per lane);
        consumed in-process (``batches()``, ``zephon dump``) a fresh run keeps the plain
        round-robin, so its interleaving of lanes is the same on every runner. Nor when the
        lanes end together (:attr:`end_together`): seq 0 then waits until every lane is known
        to produce a batch, which one round of chunks usually promises
        (:mod:`.lane_promises`), while feeding lane after lane to its first batch would take
        two or more chunks of each.
        """
        out = {}
        for lane, log_ in self.logs.items():
            cursor = targets.get(lane)
            if cursor is not None:
                out[lane] = min(self._epoch_end(cursor[0]), cursor[0] + 2)
            elif self.gate is not None and not self.end_together:
                out[lane] = log_.start.boundary_chunk + FIRST_BATCH_CHUNKS
        return out

    def _boundary(self, log_: LaneLog, next_seq: int) -> int | None:
        """The epoch boundary (chunk id) a resume at ``next_seq`` regenerates the lane from;
        None when the position is not retained. The lock is held."""
        if next_seq == log_.start.next_seq:
            return log_.start.boundary_chunk
        cut = log_.cut(next_seq)
        if cut is None or cut[0] is None:
            return None
        return (int(cut[0][0]) // self.k) * self.k

    def epoch_start(self, lane: int, next_seq: int) -> tuple[int, int]:
        """``(boundary, first)``: the epoch boundary a resume at ``next_seq`` regenerates
        ``lane`` from, and the first retained position whose resume regenerates from that same
        boundary. Resumes at any position of one epoch produce the same batches from the
        epoch's first cut on (cuts fall between whole batches), which lets one replay serve
        them all. Raises :class:`CheckpointError` for a position not retained."""
        with self._lock:
            log_ = self.logs[lane]
            boundary = self._boundary(log_, next_seq)
            if boundary is None:
                raise CheckpointError(f"lane {lane}: position {next_seq} is not retained")
            # Boundaries never decrease with the position: bisect for the epoch's first cut.
            lo = log_.start.next_seq
            if log_.history and log_.history[0][0] > lo:
                lo = log_.history[0][0] + 1  # the oldest cut points were rotated out
            hi = next_seq
            while lo < hi:
                mid = (lo + hi) // 2
                if self._boundary(log_, mid) == boundary:
                    hi = mid
                else:
                    lo = mid + 1
            return boundary, lo

    def _evict_cache(self, cache: ReplayCache, lane: int, chunk: int) -> None:
        """The source starts ``lane``'s ``chunk``: let the replay cache drop the epochs no
        checkpoint can still need (see the class docstring)."""
        if chunk % self.k:
            return  # only at epoch starts: chunk directories are dropped by whole epochs
        floor: int | None = chunk
        if self.checkpoint_floor is not None:
            position = self.checkpoint_floor(lane)
            if position is None:
                return
            with self._lock:
                floor = self._boundary(self.logs[lane], position)
            if floor is None:
                return  # not retained here (another run's position): evict next time
        cache.on_chunk(lane, chunk, self.k, floor=floor)

    def dataset_token_shares(self) -> dict[str, float]:
        """Share of delivered tokens per dataset name."""
        with self._lock:
            counts = sorted(self.dataset_tokens.items())
        total = sum(n for _, n in counts)
        if not total:
            return {}
        names = self.plan.datasets
        return {names[i].spec.name: n / total for i, n in counts}

    def dataset_token_counts(self) -> dict[str, tuple[int, int]]:
        """``(tokens, trained tokens)`` delivered per dataset name (see :mod:`.token_counts`)."""
        with self._lock:
            tokens = dict(self.dataset_tokens)
            trained = dict(self.dataset_loss_tokens)
        names = self.plan.datasets
        return {names[i].spec.name: (n, trained.get(i, 0)) for i, n in sorted(tokens.items())}

    def _starts(self, resume: ResumeState | None) -> dict[int, LaneState]:
        if resume is None:
            return {lane: self.initial_lane_state(lane) for lane in self.lanes}
        resume.check_compatible(
            self.plan.fingerprint, self.plan.components, datasets=self.plan.datasets
        )
        missing = [lane for lane in self.lanes if lane not in resume.lanes]
        if missing:
            raise IncompatibleCheckpoint(
                f"checkpoint has no state for lanes {missing}; it covers {sorted(resume.lanes)}"
            )
        for lane in self.lanes:
            ws = resume.lanes[lane].work_source
            if ws is not None:
                self.work_source.restore_state(ws)
        return {lane: resume.lanes[lane] for lane in self.lanes}

    def initial_lane_state(self, lane: int) -> LaneState:
        """The state of a lane before its first batch."""
        return LaneState(0, 0, None, None, CHAIN_SEED)

    def checkpoint(
        self, positions: dict[int, int] | None = None, tag: str = "", end: int | None = None
    ) -> ResumeState:
        """Resume state at ``positions`` (lane -> next_seq; default: everything produced).
        ``end``: the common end of the lanes when the caller applies it (the hub's gate);
        this run's own when it applies it itself.

        Raises :class:`CheckpointError` for a position not produced yet, past the common end
        or no longer retained.
        """
        with self._lock:
            return self._checkpoint(positions, tag, self.ends.end if self.ends is not None else end)

    def _checkpoint(
        self, positions: dict[int, int] | None, tag: str, end: int | None
    ) -> ResumeState:
        if positions is None:
            positions = {
                lane: log.next_seq
                if end is None
                else min(log.next_seq, max(end, log.start.next_seq))
                for lane, log in self.logs.items()
            }
        lanes: dict[int, LaneState] = {}
        for lane, next_seq in sorted(positions.items()):
            log_ = self.logs.get(lane)
            if log_ is None:
                raise CheckpointError(f"lane {lane} is not part of this run ({self.lanes})")
            if end is not None and next_seq > max(end, log_.start.next_seq):
                raise CheckpointError(  # known once final: never produced, or cut
                    f"lane {lane}: position {next_seq} is past the common end {end} of this "
                    "run (end_of_data: shortest ends every lane there; the batches after it "
                    f"were cut and never delivered): give a position of {end} at most"
                )
            if next_seq > log_.next_seq:
                raise CheckpointError(
                    f"lane {lane}: position {next_seq} was not produced yet "
                    f"(produced up to {log_.next_seq}): checkpoint the positions consumed; if "
                    "they are, this server restarted behind the trainer (fresh, or from an "
                    "older checkpoint): resume it to the trainer's checkpoint first "
                    "(client.resume(state=...) or --resume ID)"
                )
            cut = log_.cut(next_seq)
            if cut is None:
                oldest = log_.history[0][0] + 1 if log_.history else log_.next_seq
                raise CheckpointError(
                    f"lane {lane}: position {next_seq} is no longer retained "
                    f"(checkpointable range {oldest}..{log_.next_seq})"
                )
            cursor, chain = cut
            if cursor is None:
                lanes[lane] = LaneState(next_seq, 0, None, None, chain)
                if next_seq == log_.start.next_seq:
                    lanes[lane] = log_.start
                continue
            boundary = (cursor[0] // self.k) * self.k
            ws = self.work_source.state_at(self.work_source.global_index(lane, boundary))
            lanes[lane] = LaneState(next_seq, boundary, ws, cursor, chain)
        return ResumeState(
            fingerprint=self.plan.fingerprint,
            components=dict(self.plan.components),
            lanes=lanes,
            num_lanes=self.plan.pipeline.lanes,
            tag=tag,
        )

    def _count_tombstones(self, metas: Sequence[SampleMeta]) -> None:
        names = self.plan.datasets
        with self._lock:  # stats() reads the counter from other threads (metrics scrapes)
            for meta in metas:
                self.tombstones[(names[meta.dataset_id].spec.name, meta.tombstone)] += 1

    def stats(self) -> dict[str, Any]:
        """Counters so far: batches, tokens, skipped malformed records per dataset, tombstones.

        ``batches`` and ``tokens`` count what the lanes *produced*: under ``end_of_data:
        shortest`` that includes the batches cut after the common end (``end_of_data`` in the
        result says how many per lane), which were never delivered."""
        skipped: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        with self._lock:
            tombstones = list(self.tombstones.items())
        for (dataset, reason), n in tombstones:
            reasons[reason] += n
            if reason in SKIP_REASONS:
                skipped[dataset] += n
        return {
            "batches": self.batches_out,
            "tokens": self.tokens_out,
            "skipped": dict(skipped),
            "tombstones": dict(reasons),
            "replayed": sum(
                d.acc.dropped for d in self.drivers if isinstance(d.acc, ReplayFilterAccumulator)
            ),
            "elapsed_s": time.monotonic() - self.started,
            "replay_cache": self._replay_cache_stats(),
            "end_of_data": None if self.ends is None else self.ends.stats(),
        }

    def _replay_cache_stats(self) -> dict[str, int] | None:
        """Replay-cache hits/misses/stored records (counted where tokenizing runs: this
        process for the inline and threads runners)."""
        cache = self.replay_cache
        if cache is None:
            return None
        return {"hits": cache.hits, "misses": cache.misses, "stored": cache.stored}

    def _build(self) -> Iterator[list[Any]]:
        plan = self.plan
        targets = {
            lane: log.start.replay_cursor
            for lane, log in self.logs.items()
            if log.start.replay_cursor is not None
        }
        extras: dict[str, Any] = {REPLAY_CURSORS: targets, REPLAY_CACHE: self.replay_cache}
        for index, op in enumerate(plan.ops):
            op.setup(plan.context(op, index, extras=extras))
        cache = self.replay_cache
        source = LaneSource(
            self.work_source,
            self.lanes,
            flush_every_k_chunks=plan.pipeline.flush_every_k_chunks,
            start_chunks={lane: log.start.boundary_chunk for lane, log in self.logs.items()},
            max_chunks_per_lane=self.max_chunks_per_lane,
            gate=self.gate,
            replay_first=self._first_batch_priority(targets),
            delivered=self._delivered_lanes,
            on_chunk=None
            if cache is None
            else (lambda lane, chunk: self._evict_cache(cache, lane, chunk)),
        )
        stream: Iterator[list[Any]] = iter(source)
        op_index = {id(op): i for i, op in enumerate(plan.ops)}
        counted, counter = self._promise_counter(targets)
        for stage in plan.stages:
            drivers: list[StepDriver] = []
            for step in stage.steps:
                ctx = plan.context(step.head, op_index[id(step.head)], extras=extras)
                acc = step.head.accumulator(deterministic=plan.execution.deterministic, ctx=ctx)
                driver = StepDriver(step, acc)
                if len(self.drivers) + len(drivers) == counted:  # this step's index overall
                    driver.counter = counter
                drivers.append(driver)
            self.drivers.extend(drivers)
            runner = make_runner(stage.runner, drivers, plan, extras)
            self.runners.append(runner)
            stream = runner.run(stream)
        return stream

    def _promise_counter(
        self, targets: Mapping[int, Any]
    ) -> tuple[int | None, Callable[[list[Any]], None] | None]:
        """The step (index over every stage's steps) whose input is counted for
        :attr:`on_promise`, and the counter (:mod:`.lane_promises`); ``(None, None)`` when
        nothing is: no listener, no conserving tail, or no fresh lane (the others replay)."""
        if self.on_promise is None:
            return None, None
        found = counting_step([step.ops for stage in self.plan.stages for step in stage.steps])
        fresh = {
            lane: log_.start.next_seq for lane, log_ in self.logs.items() if lane not in targets
        }
        if found is None or not fresh:
            return None, None
        index, batch_size = found
        return index, LanePromises(batch_size, fresh, self.on_promise).count

    def __iter__(self) -> Iterator[NumberedBatch | LaneEnd]:
        items = self._items()
        if self.ends is None:
            return items
        return deliver(items, self.ends, self.logs)

    def _items(self) -> Iterator[NumberedBatch | LaneEnd]:
        """Every lane's produced batches (numbered, chained) and ends, as they come."""
        stream = self._build()
        try:
            for items in stream:
                for item in items:
                    kind = type(item)
                    if kind is SampleBatch:
                        log_ = self.logs[item.lane_id]
                        if item.tombstones:
                            self._count_tombstones(item.tombstones)
                        if item.rows:
                            with self._lock:
                                count_batch_tokens(
                                    item, self.dataset_tokens, self.dataset_loss_tokens
                                )
                                numbered = log_.add(item)
                            self._delivered_lanes.add(item.lane_id)
                            self.batches_out += 1
                            self.tokens_out += item.num_tokens()
                            yield numbered
                        else:
                            log_.tail_tombstones.extend(item.tombstones)
                    elif kind is FlushSentinel:
                        pass
                    elif kind is LaneEnd:
                        self.logs[item.lane_id].ended = True
                        yield item
                    else:
                        raise ConfigError(
                            f"pipeline output must be batches, got {kind.__name__}; end the "
                            "pipeline with 'batch'"
                        )
        finally:
            self.close()

    def batches(self) -> Iterator[NumberedBatch]:
        """Only the batches, in output order."""
        for item in self:
            if type(item) is NumberedBatch:
                yield item

    def close(self) -> None:
        """Stop every runner's threads and workers."""
        for runner in self.runners:
            runner.close()
        if self.release_shared_memory and any(
            stage.runner == "processes" for stage in self.plan.stages
        ):
            from . import shm

            shm.release_all()
