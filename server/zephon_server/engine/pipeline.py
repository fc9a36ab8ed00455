"""Pipeline definitions: what shapes the data, built in Python or loaded from YAML.

A :class:`Pipeline` holds the datasets, the operator chain and the data-shaping settings
(seed, lanes, chunk size, sentinel cadence). Execution settings live apart in
:class:`~zephon_server.engine.execution.ExecutionConfig`, so they can never change the data::

    pipe = (Pipeline([DatasetSpec("web", "data/web", 1.0)], seed=1234, lanes=8)
            .decode_text()
            .tokenize(tokenizer="byte")
            .batch(microbatch_size=8))
    for batch in pipe.run(ExecutionConfig(runner="threads", workers=4)).batches():
        ...
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .datasets import DEFAULT_MAX_DOCUMENT_BYTES, DatasetSpec
from .errors import ConfigError
from .execution import ExecutionConfig
from .lane_ends import DEFAULT_END_OF_DATA, check_end_of_data
from .ops import OPERATORS, Operator

if TYPE_CHECKING:
    from .planner import Plan
    from .run import PipelineRun

#: 2: shards are identified by size and modification time (``ShardInfo.identity``), and the
#: components name each dataset's settings and its shards apart (``shards:<name>``).
#: 3: the work source orders shards, rows and lanes with the project's own permutation
#: (:mod:`.permutation`) instead of numpy's ``PCG64`` streams: the same settings give another
#: data order, so nothing keyed by a version-2 fingerprint (checkpoints, replay caches) applies.
FINGERPRINT_VERSION = 3

#: What each fingerprint version changed, for the error refusing a checkpoint of an older one.
FINGERPRINT_CHANGES = {
    2: "identifies every shard by its size and modification time",
    3: "orders shards, rows and lanes with Zephon's own permutation instead of numpy's",
}


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


class Pipeline:
    """Datasets + operators + data-shaping settings; immutable once planned.

    ``end_of_data`` (``shortest`` default, or ``longest``) decides where the lanes of a
    finite stream end (:mod:`.lane_ends`)."""

    def __init__(
        self,
        datasets: Sequence[DatasetSpec],
        *,
        seed: int = 0,
        lanes: int = 8,
        chunk_size: int = 256,
        flush_every_k_chunks: int = 8,
        base_dir: str = ".",
        ops: Sequence[Operator] = (),
        end_of_data: str = DEFAULT_END_OF_DATA,
    ) -> None:
        if not datasets:
            raise ConfigError("datasets: at least one dataset is required")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"seed: must be an integer, got {seed!r}")
        self.datasets = list(datasets)
        self.seed = seed
        self.lanes = _positive_int("lanes", lanes)
        self.chunk_size = _positive_int("chunk_size", chunk_size)
        self.flush_every_k_chunks = _positive_int("flush_every_k_chunks", flush_every_k_chunks)
        self.base_dir = base_dir
        self.ops: list[Operator] = list(ops)
        #: ``shortest``: every lane of a finite stream ends where the shortest one ends, so
        #: every data-parallel rank takes the same number of steps; ``longest``: each lane
        #: runs to its own end (:mod:`.lane_ends`).
        self.end_of_data = check_end_of_data(end_of_data)

    # -- builder --------------------------------------------------------------------------

    def apply(self, op: Operator) -> Pipeline:
        """Append an operator instance (built-in or custom); returns self for chaining."""
        if not isinstance(op, Operator):
            raise ConfigError(f"pipeline: expected an Operator, got {type(op).__name__}")
        op.declared_traits()  # a missing or bad OpTraits fails here, naming the operator
        self.ops.append(op)
        return self

    def add(self, name: str, **params: Any) -> Pipeline:
        """Append a built-in operator by its config name."""
        cls = OPERATORS.get(name)
        if cls is None:
            raise ConfigError(
                f"pipeline: unknown operator {name!r}; known operators: {sorted(OPERATORS)}"
            )
        return self.apply(cls(**params))

    def decode_text(self, **params: Any) -> Pipeline:
        return self.add("decode_text", **params)

    def tokenize(self, **params: Any) -> Pipeline:
        return self.add("tokenize", **params)

    def map_transform(self, fn: Callable[..., Any] | str, **params: Any) -> Pipeline:
        return self.add("map_transform", fn=fn, **params)

    def batch(self, **params: Any) -> Pipeline:
        return self.add("batch", **params)

    def __getattr__(self, name: str) -> Callable[..., Pipeline]:
        if name in OPERATORS:
            return lambda **params: self.add(name, **params)
        raise AttributeError(name)

    # -- planning and running ---------------------------------------------------------------

    def plan(self, execution: ExecutionConfig | None = None) -> Plan:
        """Compile into stages for ``execution`` (validates datasets and the chain)."""
        from .planner import compile_plan

        return compile_plan(self, execution or ExecutionConfig())

    def explain(self, execution: ExecutionConfig | None = None) -> str:
        """Human-readable plan: stages, runner, operators with parallelism and micro-batch."""
        return self.plan(execution).explain()

    def run(self, execution: ExecutionConfig | None = None, **kwargs: Any) -> PipelineRun:
        """Start a run; iterate it for batches (see :class:`PipelineRun`)."""
        from .run import PipelineRun

        return PipelineRun(self.plan(execution), **kwargs)


def fingerprint(pipeline: Pipeline, dataset_infos: Sequence[Any]) -> str:
    """sha256 over everything that shapes data; execution settings are excluded.

    Covers datasets (names, weights, policies, and per shard its file name, row count and
    identity: size and modification time), operator parameters (tokenizer identity included),
    seed, lanes, chunk size and sentinel cadence. File names enter without their directory, so
    a corpus copied elsewhere with its times preserved (``cp -p``) keeps the fingerprint.
    """
    doc = fingerprint_document(pipeline, dataset_infos)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def fingerprint_document(pipeline: Pipeline, dataset_infos: Sequence[Any]) -> dict[str, Any]:
    """The plain data the fingerprint hashes (also used to say *what* differs)."""
    datasets = []
    for info in dataset_infos:
        spec = info.spec
        datasets.append(
            {
                "name": spec.name,
                "weight": spec.weight,
                "text_field": spec.text_field,
                "on_error": spec.on_error,
                "exhaustion": spec.exhaustion,
                "shards": [
                    [s.path.rsplit("/", 1)[-1], s.num_rows, s.identity] for s in info.shards
                ],
            }
        )
        # Added after fingerprints were in use: only a non-default value enters, so existing
        # pipelines (and their checkpoints) keep their fingerprint.
        if spec.max_document_bytes != DEFAULT_MAX_DOCUMENT_BYTES:
            datasets[-1]["max_document_bytes"] = spec.max_document_bytes
        if spec.record_columns:
            datasets[-1]["record_columns"] = list(spec.record_columns)
    doc: dict[str, Any] = {
        "version": FINGERPRINT_VERSION,
        "seed": pipeline.seed,
        "lanes": pipeline.lanes,
        "chunk_size": pipeline.chunk_size,
        "flush_every_k_chunks": pipeline.flush_every_k_chunks,
        "datasets": datasets,
        "ops": [{"op": op.op_name, **_jsonable(op.params())} for op in pipeline.ops],
    }
    # Added after fingerprints were in use: only a non-default value enters, so existing
    # pipelines (and their checkpoints) keep their fingerprint.
    if pipeline.end_of_data != DEFAULT_END_OF_DATA:
        doc["end_of_data"] = pipeline.end_of_data
    return doc


def fingerprint_components(pipeline: Pipeline, dataset_infos: Sequence[Any]) -> dict[str, str]:
    """Short hashes of each part of the fingerprint, so a mismatch can name what differs.

    ``dataset:<name>`` covers a dataset's settings and ``shards:<name>`` its shard list (names,
    rows, identities): a differing ``shards:`` part is changed data, which the shard manifest
    (:mod:`.manifest`) can then explain file by file.
    """
    doc = fingerprint_document(pipeline, dataset_infos)

    def h(value: Any) -> str:
        return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]

    parts = {"fingerprint_version": str(doc["version"])}
    parts.update({k: str(doc[k]) for k in ("seed", "lanes", "chunk_size", "flush_every_k_chunks")})
    if "end_of_data" in doc:
        parts["end_of_data"] = doc["end_of_data"]
    parts["datasets"] = ",".join(d["name"] for d in doc["datasets"])
    for d in doc["datasets"]:
        parts[f"dataset:{d['name']}"] = h({k: v for k, v in d.items() if k != "shards"})
        parts[f"shards:{d['name']}"] = h(d["shards"])
    parts["operators"] = ",".join(op["op"] for op in doc["ops"])
    for i, op in enumerate(doc["ops"]):
        parts[f"op{i}:{op['op']}"] = h(op)
    return parts


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, str | int | float | bool | type(None)) else repr(v)
        for k, v in params.items()
    }
