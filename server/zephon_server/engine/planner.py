"""The planner: compiles a pipeline into stages of steps and explains the result.

* ``fetch`` is inserted first; ``decode_text`` is inserted after it when the chain does not
  start with it.
* The chain must end with ``batch`` (the unit sent to trainers); the replay filter is
  inserted immediately before it and runs in its driver (no workers).
* Consecutive operators with the same placement form a stage. Within a stage, consecutive
  fusable operators (stateless, count-grouped) are fused into one step when ``fuse`` is on:
  they run in the same worker call, grouped by the first operator's accumulator. This does
  not change data, because their grouping is stateless.
* Runner per stage: ``placement="remote"`` stages use Ray; stages of stateful or batching
  operators run on threads when the configured runner is ``processes`` or ``ray`` (their
  workers do little, so shipping records elsewhere would only cost); everything else,
  including the map-like stages under ``runner: ray``, uses the configured runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import lane_ends
from .datasets import DatasetInfo, register_buckets, resolve_datasets
from .errors import ConfigError
from .execution import ExecutionConfig
from .index_budget import enforce
from .index_dir import IndexDir, open_index_dir
from .ops import Batch, DecodeText, Fetch, OpContext, Operator, RenderChat, Tokenize
from .ops.replay import ReplayFilter
from .pipeline import Pipeline, fingerprint, fingerprint_components
from .runners.steps import Step
from .shards import cache_for

#: Operators that turn records into token ids (a pipeline needs one; the last sets the pad id).
TOKENIZING = (Tokenize, RenderChat)


@dataclass
class StagePlan:
    """A group of steps executed by one runner."""

    index: int
    runner: str
    steps: list[Step]


@dataclass
class Plan:
    """A compiled pipeline: stages, resolved datasets, fingerprint and execution settings."""

    pipeline: Pipeline
    execution: ExecutionConfig
    datasets: list[DatasetInfo]
    ops: list[Operator]
    stages: list[StagePlan] = field(default_factory=list)
    pad_id: int = 0
    fingerprint: str = ""
    components: dict[str, str] = field(default_factory=dict)
    #: Where the shard index lives (None: in memory only); handed to every operator.
    index: IndexDir | None = None

    def context(
        self, op: Operator, index: int, worker_id: int = 0, extras: dict[str, Any] | None = None
    ) -> OpContext:
        """The OpContext handed to ``op`` (the ``index``-th operator of the plan); ``extras``
        are a run's services (replay cursors, replay cache), copied into the context."""
        return OpContext(
            op_name=op.op_name,
            op_index=index,
            lanes=self.pipeline.lanes,
            seed=self.pipeline.seed,
            deterministic=self.execution.deterministic,
            datasets=tuple(self.datasets),
            pad_id=self.pad_id,
            worker_id=worker_id,
            extras=dict(extras or {}),
            index=self.index,
            spill_max_bytes=self.execution.spill_max_bytes if self.index is None else None,
        )

    def explain(self) -> str:
        """Stages, runner per stage, operators with parallelism and micro-batch size."""
        p = self.pipeline
        ex = self.execution
        lines = [
            f"pipeline {self.fingerprint[:16]}  seed={p.seed} lanes={p.lanes} "
            f"chunk_size={p.chunk_size} flush_every_k_chunks={p.flush_every_k_chunks}",
            f"execution: runner={ex.runner} workers={ex.workers} "
            f"deterministic={ex.deterministic} fuse={ex.fuse}",
            lane_ends.describe(p),
            "datasets:",
        ]
        total = sum(d.spec.weight for d in self.datasets)
        for d in self.datasets:
            lines.append(
                f"  {d.spec.name}: weight={d.spec.weight} ({d.spec.weight / total:.1%}) "
                f"shards={len(d.shards)} rows={d.num_rows} on_error={d.spec.on_error} "
                f"exhaustion={d.spec.exhaustion}"
            )
            if d.spec.storage_options is not None:  # secrets masked
                lines.append(f"    storage_options: {d.spec.storage_options.public()}")
        lines.append(
            f"shard index: {self.index.describe() if self.index else 'memory (no index dir)'}"
        )
        for stage in self.stages:
            lines.append(f"stage {stage.index} [{stage.runner}]")
            for step in stage.steps:
                fused = " (fused)" if len(step.ops) > 1 else ""
                stall = " stalls-at-sentinel" if step.stalls else ""
                par = f"parallelism={step.workers}" if step.workers else "in-driver"
                lines.append(
                    f"  step {step.index}{fused}: {par} microbatch={step.microbatch_size}{stall}"
                )
                for op in step.ops:
                    lines.append(f"    {op.describe()}")
        return "\n".join(lines)


def _check_chain(ops: list[Operator]) -> list[Operator]:
    if not ops or not isinstance(ops[-1], Batch):
        raise ConfigError(
            "pipeline: the last operator must be 'batch' (batches are what trainers receive); "
            "add e.g. '- batch: {microbatch_size: 8}'"
        )
    for op in ops[:-1]:
        if isinstance(op, Batch):
            raise ConfigError("pipeline: 'batch' may appear only once, as the last operator")
    if not any(isinstance(op, TOKENIZING) for op in ops):
        raise ConfigError(
            "pipeline: batches are built from token ids, but there is no 'tokenize' step; "
            "add e.g. '- tokenize: {tokenizer: byte}' before 'batch' (or 'render_chat' for "
            "chat data)"
        )
    records = any(isinstance(op, RenderChat) for op in ops)
    if records:
        _check_chat_chain(ops)
    elif not isinstance(ops[0], DecodeText):
        ops = [DecodeText(), *ops]
    return [Fetch(records=records), *ops[:-1], ReplayFilter(), ops[-1]]


def _check_chat_chain(ops: list[Operator]) -> None:
    """``render_chat`` reads the fetched record itself and tokenizes: it comes first (no
    ``decode_text`` is inserted) and replaces ``decode_text`` and ``tokenize``."""
    for op in ops:
        if isinstance(op, DecodeText | Tokenize):
            raise ConfigError(
                f"pipeline: 'render_chat' replaces 'decode_text' and 'tokenize' (it reads the "
                f"record and tokenizes it); remove '{op.op_name}'"
            )
    if not isinstance(ops[0], RenderChat) or sum(isinstance(op, RenderChat) for op in ops) > 1:
        raise ConfigError(
            "pipeline: 'render_chat' must be the first operator, and appear once (it reads "
            "the fetched record)"
        )


def compile_plan(pipeline: Pipeline, execution: ExecutionConfig) -> Plan:
    """Resolve datasets, check the chain, group into stages and steps."""
    ops = _check_chain(list(pipeline.ops))
    for op in ops:  # before any shard is listed: a misspelt name fails at once
        op.check_datasets(pipeline.datasets)
    records = any(isinstance(op, RenderChat) for op in ops)
    for spec in pipeline.datasets:
        if spec.record_columns and not records:
            raise ConfigError(
                f"dataset {spec.name!r}: record_columns make a record of several Parquet "
                "columns for render_chat, and this pipeline has none; read one column with "
                "text_field, or add render_chat"
            )
    register_buckets(pipeline.datasets)  # an index in a dataset's bucket uses its options
    index = open_index_dir(
        execution.index_dir,
        max_bytes=execution.index_max_bytes,
        spill_max_bytes=execution.spill_max_bytes,
    )
    cache = cache_for(index)
    if index is None and execution.spill_max_bytes is not None:  # no index directory: the
        cache.index.store.spill_max_bytes = execution.spill_max_bytes  # budget of temp spills
    writes = cache.index.writes + cache.index.catalog_writes
    datasets = resolve_datasets(
        pipeline.datasets,
        base_dir=pipeline.base_dir,
        cache=cache,
        records=records,
    )
    if cache.index.writes + cache.index.catalog_writes != writes:
        enforce(cache.index)  # only a start that wrote can have grown the directory
    tokenizers = [op for op in ops if isinstance(op, TOKENIZING)]
    pad_id = tokenizers[-1].tokenizer.pad_id if tokenizers else 0
    plan = Plan(
        pipeline,
        execution,
        datasets,
        ops,
        pad_id=pad_id,
        fingerprint=fingerprint(pipeline, datasets),
        components=fingerprint_components(pipeline, datasets),
        index=index,
    )

    # Group into stages by placement, then into steps by fusability.
    groups: list[list[Operator]] = []
    for op in ops:
        if groups and groups[-1][-1].placement == op.placement and _same_stage(groups[-1], op):
            groups[-1].append(op)
        else:
            groups.append([op])
    step_index = 0
    for s_index, group in enumerate(groups):
        steps: list[Step] = []
        run: list[Operator] = []
        for op in group:
            if execution.fuse and run and _fusable(op) and _fusable(run[-1]):
                run.append(op)
                continue
            if run:
                steps.append(Step(run, step_index, _workers(run, execution)))
                step_index += 1
            run = [op]
        steps.append(Step(run, step_index, _workers(run, execution)))
        step_index += 1
        plan.stages.append(StagePlan(s_index, _runner_for(group, execution), steps))
    return plan


def _fusable(op: Operator) -> bool:
    """The operator's declared ``fusable`` (its traits checked: a bad declaration names it)."""
    return op.declared_traits().fusable


def _same_stage(group: list[Operator], op: Operator) -> bool:
    """Map-like (fusable) operators share a stage; stateful ones start their own."""
    return _fusable(group[-1]) == _fusable(op)


def _workers(ops: list[Operator], execution: ExecutionConfig) -> int:
    if isinstance(ops[0], ReplayFilter):
        return 0  # runs in its driver thread: it only drops records
    if execution.runner == "inline":
        return 1
    explicit = [op.parallelism for op in ops if op.parallelism]
    if explicit:
        return max(explicit)
    if all(op.default_parallelism == 0 for op in ops):
        return 0  # cheap work: in the driver thread (set parallelism to use a pool)
    return execution.workers


def _runner_for(group: list[Operator], execution: ExecutionConfig) -> str:
    if group[0].placement == "remote":
        return "ray"
    if execution.runner in ("processes", "ray") and not _fusable(group[0]):
        return "threads"
    return execution.runner
