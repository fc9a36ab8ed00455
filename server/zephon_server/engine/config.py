"""YAML pipeline configs: load, validate with errors that name the key, build a Pipeline.

Binding keys::

    seed: 1234
    lanes: 8
    chunk_size: 256
    flush_every_k_chunks: 8
    end_of_data: shortest                # or longest: where the lanes of a finite stream end
    datasets:
      - {name: web, path: data/web, weight: 0.7}
      - {name: code, path: "data/code/*.parquet", weight: 0.3, text_field: content,
         on_error: skip}
    pipeline:
      - decode_text: {}
      - tokenize: {tokenizer: byte}        # or a path to tokenizer.json
      - batch: {microbatch_size: 8}
    execution: {runner: threads, workers: 4, deterministic: true}
    index_dir: /var/cache/zephon/index   # optional; 'none' keeps the shard index in memory
    index_max_bytes: 10G                 # optional; the index directory's disk budget
    spill_max_bytes: 50G                 # optional; disk for decompressed large shards

Relative dataset, tokenizer and index paths resolve against the config file's directory.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from .datasets import DatasetSpec
from .errors import ConfigError
from .execution import ExecutionConfig, byte_size
from .ops import OPERATORS
from .pipeline import Pipeline
from .storage.location import is_url

TOP_LEVEL_KEYS = (
    "seed",
    "lanes",
    "chunk_size",
    "flush_every_k_chunks",
    "end_of_data",
    "datasets",
    "pipeline",
    "execution",
    "index_dir",
    "index_max_bytes",
    "spill_max_bytes",
)
DATASET_KEYS = tuple(f.name for f in dataclasses.fields(DatasetSpec))


def load_config(path: str | os.PathLike[str]) -> tuple[Pipeline, ExecutionConfig]:
    """Read a YAML config file into a pipeline and its execution settings."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {str(file)!r} does not exist")
    # Functions named in the config (map_transform fn: "module:function") may live beside it.
    directory = str(file.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    return parse_config(data, base_dir=str(file.resolve().parent), source=str(file))


def parse_config(
    data: Any, *, base_dir: str = ".", source: str = "config"
) -> tuple[Pipeline, ExecutionConfig]:
    """Validate a config mapping and build the pipeline (see the module docstring)."""
    _check_top_level(data, source)
    datasets = [_dataset(i, entry) for i, entry in enumerate(_list(data, "datasets"))]
    settings = {
        k: data[k]
        for k in ("seed", "lanes", "chunk_size", "flush_every_k_chunks", "end_of_data")
        if k in data
    }
    pipeline = Pipeline(datasets, base_dir=base_dir, **settings)
    for i, entry in enumerate(_list(data, "pipeline")):
        _add_operator(pipeline, i, entry, base_dir)
    return pipeline, _execution(data, base_dir)


def _check_top_level(data: Any, source: str) -> None:
    """A :class:`ConfigError` unless ``data`` is a mapping of known keys with the required
    ones."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at top level, got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key {unknown[0]!r}; allowed keys: {list(TOP_LEVEL_KEYS)}"
        )
    for key in ("datasets", "pipeline"):
        if key not in data:
            raise ConfigError(f"{source}: missing required key {key!r}")


def _add_operator(pipeline: Pipeline, i: int, entry: Any, base_dir: str) -> None:
    """Add ``pipeline[i]`` to ``pipeline``, its parameters checked against the operator's
    (every error names the entry)."""
    name, params = _op_entry(i, entry)
    params = _resolve_paths(name, params, base_dir)
    accepted = OPERATORS[name].accepted_params()
    missing = sorted(
        n
        for n, prm in accepted.items()
        if prm.default is prm.empty and prm.kind is prm.KEYWORD_ONLY and n not in params
    )
    if missing:
        raise ConfigError(
            f"pipeline[{i}].{name}: missing required parameter {missing[0]!r} "
            f"(e.g. '- {name}: {{{missing[0]}: ...}}')"
        )
    unknown = sorted(set(params) - set(accepted) - {"kwargs"})
    if unknown:
        names = sorted(n for n in accepted if n != "kwargs")
        raise ConfigError(
            f"pipeline[{i}].{name}: unknown parameter {unknown[0]!r}; accepted: {names}"
        )
    try:
        pipeline.add(name, **params)
    except (ConfigError, TypeError) as exc:
        text = str(exc)  # an operator's own message names it already: say it once
        text = text[len(name) + 2 :] if text.startswith(f"{name}: ") else text
        raise ConfigError(f"pipeline[{i}].{name}: {text}") from exc


def _execution(data: dict[str, Any], base_dir: str) -> ExecutionConfig:
    """The ``execution`` section, with the top-level index directory and disk budgets."""
    execution_data = data.get("execution") or {}
    if not isinstance(execution_data, dict):
        raise ConfigError(f"execution: expected a mapping, got {type(execution_data).__name__}")
    execution = ExecutionConfig.from_mapping(execution_data)
    index_dir = _index_dir(data.get("index_dir"), base_dir)
    budgets: dict[str, Any] = {
        name: byte_size(data[name], name)
        for name in ("index_max_bytes", "spill_max_bytes")
        if data.get(name) is not None
    }
    return dataclasses.replace(execution, index_dir=index_dir, **budgets)


def _index_dir(value: Any, base_dir: str) -> str | None:
    """The ``index_dir`` key: a directory (relative to the config file) or ``none``."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"index_dir: must be a directory path or 'none' (keep the shard index in memory "
            f"only), got {value!r}"
        )
    if value == "none" or is_url(value):
        return value
    return os.path.join(base_dir, os.path.expanduser(value))


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data[key]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: expected a non-empty list, got {value!r}")
    return value


def _dataset(i: int, entry: Any) -> DatasetSpec:
    if not isinstance(entry, dict):
        raise ConfigError(f"datasets[{i}]: expected a mapping with name, path, weight")
    unknown = sorted(set(entry) - set(DATASET_KEYS))
    if unknown:
        raise ConfigError(
            f"datasets[{i}]: unknown key {unknown[0]!r}; allowed keys: {list(DATASET_KEYS)}"
        )
    for key in ("name", "path", "weight"):
        if key not in entry:
            raise ConfigError(f"datasets[{i}]: missing required key {key!r}")
    try:
        return DatasetSpec(**entry)
    except ConfigError as exc:
        raise ConfigError(f"datasets[{i}]: {exc}") from exc


def _op_entry(i: int, entry: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        entry = {entry: {}}
    if not isinstance(entry, dict) or len(entry) != 1:
        raise ConfigError(
            f"pipeline[{i}]: each step is a one-key mapping like '- tokenize: {{...}}', "
            f"got {entry!r}"
        )
    ((name, params),) = entry.items()
    if name == "fetch":
        raise ConfigError(f"pipeline[{i}]: 'fetch' is implicit (always first); remove it")
    if name not in OPERATORS:
        raise ConfigError(
            f"pipeline[{i}]: unknown operator {name!r}; known operators: {sorted(OPERATORS)}"
        )
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(f"pipeline[{i}].{name}: parameters must be a mapping, got {params!r}")
    return name, dict(params)


def _resolve_paths(name: str, params: dict[str, Any], base_dir: str) -> dict[str, Any]:
    tok = params.get("tokenizer")
    is_file = isinstance(tok, str) and tok.endswith(".json")
    if name in ("tokenize", "render_chat") and is_file and not os.path.isabs(str(tok)):
        params["tokenizer"] = os.path.join(base_dir, str(tok))
    template = params.get("template")
    if name == "render_chat" and isinstance(template, str) and not os.path.isabs(template):
        params["template"] = os.path.join(base_dir, os.path.expanduser(template))
    return params
