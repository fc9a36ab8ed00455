"""Zephon's public Python API: the one module users import (``from zephon_server.api import ...``).

Pipelines are built, run in-process and extended with custom operators from the names below;
docs/api.md lists them and docs/custom-operators.md uses nothing else. Every other module of
``zephon_server`` (``engine.*``, ``service.*``, the CLI) is internal: it may change without
notice, and importing it directly is at your own risk. The names are re-exported, not
wrapped, so ``zephon_server.api.Pipeline is zephon_server.engine.pipeline.Pipeline``.

* Pipelines: :class:`Pipeline`, :class:`DatasetSpec`, :class:`ExecutionConfig`,
  :func:`load_config` (YAML), :class:`PipelineRun` (what ``Pipeline.run`` returns), and the
  embedded sample corpus (:func:`default_pipeline_specs`, :func:`default_pipeline`).
* Custom operators: :class:`Operator` and :class:`Accumulator` (abstract), :class:`OpTraits`
  (``preserves_cursor_order`` required), :class:`OpContext`, the built-in
  :class:`CountingAccumulator` and :class:`PassthroughAccumulator`, and the elements they
  handle (:class:`SampleRecord`, :class:`SampleMeta`, :class:`SampleBatch`).
* Built-in operators, by the class behind each YAML name (``batch`` is :class:`Batch`, ...).
* Checkpoint files: :class:`ResumeState` (decode, merge, encode) and :func:`read_state_file`.
* Errors: every one derives from :class:`ZephonError`.
"""

from __future__ import annotations

from .defaults import default_pipeline, default_pipeline_specs
from .engine.checkpoint import CheckpointError, ResumeState, read_state_file
from .engine.config import load_config
from .engine.datasets import DatasetSpec
from .engine.errors import (
    ConfigError,
    ContractError,
    DataError,
    ShardChanged,
    UnsupportedElementError,
    WorkerError,
    ZephonError,
)
from .engine.execution import ExecutionConfig
from .engine.ops import (
    Accumulator,
    Batch,
    CountingAccumulator,
    DecodeText,
    EnsureMixture,
    MapTransform,
    OpContext,
    Operator,
    OpTraits,
    PackFlat,
    PackSequences,
    PassthroughAccumulator,
    RenderChat,
    Shuffle,
    Tokenize,
)
from .engine.pipeline import Pipeline
from .engine.records import SampleBatch, SampleMeta, SampleRecord
from .engine.run import PipelineRun

__all__ = [
    "Accumulator",
    "Batch",
    "CheckpointError",
    "ConfigError",
    "ContractError",
    "CountingAccumulator",
    "DataError",
    "DatasetSpec",
    "DecodeText",
    "EnsureMixture",
    "ExecutionConfig",
    "MapTransform",
    "OpContext",
    "OpTraits",
    "Operator",
    "PackFlat",
    "PackSequences",
    "PassthroughAccumulator",
    "Pipeline",
    "PipelineRun",
    "RenderChat",
    "ResumeState",
    "SampleBatch",
    "SampleMeta",
    "SampleRecord",
    "ShardChanged",
    "Shuffle",
    "Tokenize",
    "UnsupportedElementError",
    "WorkerError",
    "ZephonError",
    "default_pipeline",
    "default_pipeline_specs",
    "load_config",
    "read_state_file",
]
