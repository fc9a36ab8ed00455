"""Running a plan: source → stages → per-lane output log.

:class:`PipelineRun` wires a :class:`LaneSource` through one runner per stage and numbers
each lane's batches (``seq``), computing content and chain digests. Iterating it yields
:class:`SampleBatch` objects (with rows) and one :class:`LaneEnd` per lane; the tombstones
that reach the end of a lane without a batch are kept in ``lane_tail_tombstones``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from .digest import CHAIN_SEED, chain_digest, content_digest
from .errors import ConfigError
from .planner import Plan
from .records import FlushSentinel, LaneEnd, SampleBatch, SampleMeta
from .runners.base import StageRunner
from .runners.inline import InlineRunner
from .runners.steps import StepDriver
from .runners.threads import ThreadsRunner
from .source import LaneSource
from .work_source import WorkSource

log = logging.getLogger(__name__)

#: Tombstone reasons that mean "a malformed or unreadable record was skipped".
SKIP_REASONS = ("malformed", "read_error")


def make_runner(kind: str, drivers: list[StepDriver], plan: Plan) -> StageRunner:
    """The stage runner for ``kind``."""
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

        return ProcessesRunner(drivers, plan=plan, **kwargs)
    if kind == "ray":
        from .runners.ray import RayRunner

        return RayRunner(drivers, plan=plan, **kwargs)
    raise ConfigError(f"unknown runner {kind!r}")


class LaneLog:
    """Numbers a lane's batches and chains their digests."""

    __slots__ = ("boundary", "chain", "lane", "next_seq", "tail_tombstones")

    def __init__(self, lane: int, next_seq: int = 0, chain: bytes = CHAIN_SEED) -> None:
        self.lane = lane
        self.next_seq = next_seq
        self.chain = chain
        self.boundary = 0
        self.tail_tombstones: list[SampleMeta] = []

    def add(self, batch: SampleBatch) -> None:
        batch.seq = self.next_seq
        batch.digest = content_digest(batch.tensors)
        batch.chain_digest = self.chain = chain_digest(self.chain, batch.digest)
        self.next_seq += 1


class PipelineRun:
    """One execution of a plan over a set of lanes; iterate for batches and lane ends."""

    def __init__(
        self,
        plan: Plan,
        *,
        lanes: Sequence[int] | None = None,
        max_chunks_per_lane: int | None = None,
    ) -> None:
        self.plan = plan
        n = plan.pipeline.lanes
        self.lanes = sorted(set(lanes)) if lanes is not None else list(range(n))
        for lane in self.lanes:
            if not 0 <= lane < n:
                raise ConfigError(f"lane {lane} does not exist; lanes are 0..{n - 1}")
        p = plan.pipeline
        self.work_source = WorkSource(
            plan.datasets, seed=p.seed, lanes=p.lanes, chunk_size=p.chunk_size
        )
        self.max_chunks_per_lane = max_chunks_per_lane
        self.logs = {lane: LaneLog(lane) for lane in self.lanes}
        self.runners: list[StageRunner] = []
        self.drivers: list[StepDriver] = []
        self.started = time.monotonic()
        self.batches_out = 0
        self.tokens_out = 0
        self.tombstones: Counter[tuple[str, str]] = Counter()  # (dataset, reason) -> count

    def _count_tombstones(self, metas: Sequence[SampleMeta]) -> None:
        names = self.plan.datasets
        for meta in metas:
            self.tombstones[(names[meta.dataset_id].spec.name, meta.tombstone)] += 1

    def stats(self) -> dict[str, Any]:
        """Counters so far: batches, tokens, skipped malformed records per dataset, tombstones."""
        skipped: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for (dataset, reason), n in self.tombstones.items():
            reasons[reason] += n
            if reason in SKIP_REASONS:
                skipped[dataset] += n
        return {
            "batches": self.batches_out,
            "tokens": self.tokens_out,
            "skipped": dict(skipped),
            "tombstones": dict(reasons),
            "elapsed_s": time.monotonic() - self.started,
        }

    def _build(self) -> Iterator[list[Any]]:
        plan = self.plan
        for index, op in enumerate(plan.ops):
            op.setup(plan.context(op, index))
        source = LaneSource(
            self.work_source,
            self.lanes,
            flush_every_k_chunks=plan.pipeline.flush_every_k_chunks,
            max_chunks_per_lane=self.max_chunks_per_lane,
        )
        stream: Iterator[list[Any]] = iter(source)
        op_index = {id(op): i for i, op in enumerate(plan.ops)}
        for stage in plan.stages:
            drivers = []
            for step in stage.steps:
                ctx = plan.context(step.head, op_index[id(step.head)])
                acc = step.head.accumulator(deterministic=plan.execution.deterministic, ctx=ctx)
                drivers.append(StepDriver(step, acc))
            self.drivers.extend(drivers)
            runner = make_runner(stage.runner, drivers, plan)
            self.runners.append(runner)
            stream = runner.run(stream)
        return stream

    def __iter__(self) -> Iterator[SampleBatch | LaneEnd]:
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
                            log_.add(item)
                            self.batches_out += 1
                            self.tokens_out += item.num_tokens()
                            yield item
                        else:
                            log_.tail_tombstones.extend(item.tombstones)
                    elif kind is FlushSentinel:
                        self.logs[item.lane_id].boundary = item.boundary_chunk_id
                    elif kind is LaneEnd:
                        yield item
                    else:
                        raise ConfigError(
                            f"pipeline output must be batches, got {kind.__name__}; end the "
                            "pipeline with 'batch'"
                        )
        finally:
            self.close()

    def batches(self) -> Iterator[SampleBatch]:
        """Only the batches, in output order."""
        for item in self:
            if type(item) is SampleBatch:
                yield item

    def close(self) -> None:
        """Stop every runner's threads and workers."""
        for runner in self.runners:
            runner.close()
        if any(stage.runner == "processes" for stage in self.plan.stages):
            from . import shm

            shm.release_all()
