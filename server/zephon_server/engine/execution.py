"""Execution settings: pure performance knobs that never change the data."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigError

RUNNERS = ("inline", "threads", "processes", "ray")
#: Fields set by a top-level YAML key rather than under ``execution:``.
TOP_LEVEL_FIELDS = ("index_dir", "index_max_bytes", "spill_max_bytes")
#: Fields the program running the engine sets (the ``zephon`` command), never a YAML key.
PROGRAM_FIELDS = ("worker_tuning",)


@runtime_checkable
class WorkerTuning(Protocol):
    """Process tuning a runner applies in each worker process or Ray actor it starts, before
    any operator's ``setup`` (``zephon_server.runtime.RuntimeConfig`` is one). It must pickle;
    it never changes the data."""

    def apply_in_worker(self) -> None:
        """Tune the worker process this is called in."""


@dataclass(frozen=True)
class ExecutionConfig:
    """How a pipeline runs: runner kind, workers per operator, ordering, fusion, queues.

    ``deterministic=False`` forwards results in completion order and allows latency flushes:
    every record is still delivered exactly once, but the order may vary between runs.
    ``ray_address`` is the Ray cluster of the Ray runner (unset: a private local Ray; see
    :mod:`.runners.ray`; the ``zephon`` command lets ``$ZEPHON_RAY_ADDRESS`` override it).
    ``index_dir`` is where the shard index is persisted (:mod:`.index_dir`); None or
    ``"none"`` keeps it in memory only; ``index_max_bytes`` bounds its disk use
    (:mod:`.index_budget`) and ``spill_max_bytes`` the spill files of large compressed shards
    (:mod:`.spill`), None: their defaults. These three are YAML top-level keys, not keys of
    ``execution:``. ``worker_tuning`` (not a YAML key) is applied in every worker process
    and Ray actor the runners start (None: they run untuned).
    """

    runner: str = "threads"
    workers: int = 2
    deterministic: bool = True
    fuse: bool = True
    queue_depth: int = 4
    ray_address: str | None = None
    index_dir: str | None = None
    index_max_bytes: int | None = None
    spill_max_bytes: int | None = None
    worker_tuning: WorkerTuning | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ConfigError(
                f"execution.runner: unknown runner {self.runner!r}; choose one of {RUNNERS}"
            )
        for name in ("workers", "queue_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"execution.{name}: must be an integer >= 1, got {value!r}")
        if self.ray_address is not None and (
            not isinstance(self.ray_address, str) or not self.ray_address
        ):
            raise ConfigError(
                "execution.ray_address: must be a Ray address such as 'auto', "
                f"'ray://head:10001' or 'local', got {self.ray_address!r}"
            )
        if self.index_dir is not None and (
            not isinstance(self.index_dir, str) or not self.index_dir
        ):
            raise ConfigError(
                "index_dir: must be a directory path or 'none' (keep the shard index in "
                f"memory only), got {self.index_dir!r}"
            )
        for name in ("index_max_bytes", "spill_max_bytes"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ConfigError(
                    f"{name}: must be a number of bytes >= 0 (e.g. 10G), got {value!r}"
                )
        if self.worker_tuning is not None and not isinstance(self.worker_tuning, WorkerTuning):
            raise ConfigError(
                "worker_tuning: must have an apply_in_worker() method (e.g. "
                f"zephon_server.runtime.RuntimeConfig), got {self.worker_tuning!r}"
            )
        for name in ("deterministic", "fuse"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"execution.{name}: must be true or false, got {getattr(self, name)!r}"
                )

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> ExecutionConfig:
        """Build from a config mapping, rejecting unknown keys by name."""
        data = dict(data or {})
        allowed = {f.name for f in fields(cls)} - set(TOP_LEVEL_FIELDS) - set(PROGRAM_FIELDS)
        unknown = sorted(set(data) - allowed)
        for name in TOP_LEVEL_FIELDS:
            if name in data:
                raise ConfigError(
                    f"execution: {name} is a top-level key; put '{name}: ...' beside "
                    "'execution:', not inside it"
                )
        if unknown:
            raise ConfigError(
                f"execution: unknown key {unknown[0]!r}; allowed keys: {sorted(allowed)}"
            )
        return cls(**data)

    def with_overrides(self, **overrides: Any) -> ExecutionConfig:
        """A copy with the non-None overrides applied (CLI flags)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def byte_size(value: Any, name: str) -> int:
    """Bytes from an integer or a text such as ``123``, ``500M``, ``2G``, ``2GiB`` (powers of
    1024); :class:`ConfigError` naming ``name`` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if not m:
        raise ConfigError(
            f"{name} must be a number of bytes with an optional K, M, G or T suffix (powers "
            f"of 1024), e.g. 10G; got {value!r}"
        )
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))
