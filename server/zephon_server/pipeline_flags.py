"""The flags that name a pipeline, and loading it: shared by every ``zephon`` command that runs
or inspects one (``explain``, ``dump``, ``serve``, ``index``, ``run-default``).

:func:`load_pipeline` returns the pipeline of ``--config``, ``--pipeline`` or the embedded
default with the command line's overrides applied to its ``ExecutionConfig``: ``--runner``,
``--workers``, the index directory, ``$ZEPHON_RAY_ADDRESS`` and the process tuning its workers
apply (:func:`tuned_runtime` for the commands other than ``serve``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .engine.errors import ZephonError

if TYPE_CHECKING:
    from .engine.execution import ExecutionConfig
    from .engine.pipeline import Pipeline
    from .runtime import RuntimeConfig

RAY_ADDRESS_ENV = "ZEPHON_RAY_ADDRESS"
"""Environment variable naming the Ray cluster; wins over ``execution.ray_address``."""


def pipeline_args(p: argparse.ArgumentParser) -> None:
    """``--config``/``--pipeline``, ``--runner``, ``--workers`` and ``--index-dir``: the flags of
    a command that loads a pipeline."""
    from .engine.execution import RUNNERS

    p.add_argument("--config", help="pipeline YAML file")
    p.add_argument("--pipeline", help="Python pipeline, file.py:function or module:function")
    p.add_argument("--runner", choices=RUNNERS, help="override execution.runner")
    p.add_argument("--workers", type=int, help="override execution.workers")
    index_dir_arg(p)


def index_dir_arg(p: argparse.ArgumentParser) -> None:
    """``--index-dir`` for a command that resolves datasets."""
    p.add_argument(
        "--index-dir",
        default=None,
        metavar="DIR",
        help="where the shard index (row counts and offsets of every shard) is kept between "
        "runs; 'none' keeps it in memory only (default: the config's index_dir, else "
        "<state-dir>/index with --state-dir, else $XDG_CACHE_HOME/zephon/index or "
        "~/.cache/zephon/index)",
    )
    p.add_argument(
        "--index-max-bytes",
        default=None,
        metavar="BYTES",
        help="disk the index directory may take, e.g. 10G (default: the config's "
        "index_max_bytes, else a tenth of its filesystem, at most 32G); entries no catalog "
        "refers to go first, then the least recently used catalogs' entries, never those of "
        "the datasets in use",
    )
    p.add_argument(
        "--spill-max-bytes",
        default=None,
        metavar="BYTES",
        help="disk for the decompressed content of large .jsonl.gz/.jsonl.zst shards, e.g. "
        "50G (default: the config's spill_max_bytes, else a tenth of its filesystem, at most "
        "64G); least recently used spill files are removed first",
    )


def load_pipeline(
    args: argparse.Namespace, runtime: RuntimeConfig | None = None
) -> tuple[Pipeline, ExecutionConfig]:
    """The pipeline named by --config or --pipeline, or the embedded default, with the
    command line's overrides: ``--runner``, ``--workers``, the index directory,
    ``$ZEPHON_RAY_ADDRESS`` and the process tuning its workers apply (``runtime``)."""
    from .engine.execution import ExecutionConfig

    if getattr(args, "config", None) and getattr(args, "pipeline", None):
        raise ZephonError("give either --config or --pipeline, not both")
    if getattr(args, "config", None):
        from .engine.config import load_config

        pipeline, execution = load_config(args.config)
    elif getattr(args, "pipeline", None):
        from .engine.ops.map_transform import resolve_callable

        pipeline, execution = _python_pipeline(
            resolve_callable(_import_path(args.pipeline), what="--pipeline")
        )
    else:
        from .defaults import default_pipeline

        pipeline, execution = default_pipeline(), ExecutionConfig()
    overrides = {
        "runner": getattr(args, "runner", None),
        "workers": getattr(args, "workers", None),
        "index_dir": index_dir_from_args(args, execution.index_dir, os.environ),
        "ray_address": os.environ.get(RAY_ADDRESS_ENV) or None,
        "worker_tuning": runtime,
        **budgets_from_args(args),
    }
    return pipeline, execution.with_overrides(**overrides)


def budgets_from_args(args: argparse.Namespace) -> dict[str, int]:
    """``--index-max-bytes`` and ``--spill-max-bytes`` as ExecutionConfig fields (the ones
    given)."""
    from .engine.errors import ConfigError
    from .engine.execution import byte_size

    out: dict[str, int] = {}
    for name in ("index_max_bytes", "spill_max_bytes"):
        value = getattr(args, name, None)
        if value is not None:
            flag = "--" + name.replace("_", "-")
            try:
                out[name] = byte_size(value, flag)
            except ConfigError as exc:
                raise ZephonError(str(exc)) from None
    return out


def index_dir_from_args(
    args: argparse.Namespace, configured: str | None, environ: Mapping[str, str]
) -> str:
    """Where the shard index lives: ``--index-dir`` (wins), else the config's ``index_dir``,
    else ``<state-dir>/index`` when there is a ``--state-dir``, else the per-user cache
    directory (``$XDG_CACHE_HOME/zephon/index``, ``~/.cache/zephon/index``). ``none`` keeps
    it in memory only."""
    from .engine.index_dir import user_index_dir

    flag = getattr(args, "index_dir", None)
    if flag is not None:
        if not flag:
            raise ZephonError("--index-dir: give a directory, or 'none' to keep it in memory")
        return str(flag)
    if configured is not None:
        return configured
    state_dir = getattr(args, "state_dir", None)
    if state_dir:
        return os.path.join(state_dir, "index")
    return user_index_dir(environ)


def _import_path(spec: str) -> str:
    """Accept ``file.py:function``: the file's directory joins ``sys.path`` and the file is
    imported under its own module name, so process and Ray workers can import it too."""
    import os

    path, _, func = spec.rpartition(":")
    if not path.endswith(".py"):
        return spec
    if not os.path.isfile(path):
        raise ZephonError(f"--pipeline: file {path!r} does not exist")
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = os.path.splitext(os.path.basename(path))[0]
    if not name.isidentifier():
        raise ZephonError(f"--pipeline: {path!r} must be named like a Python module")
    return f"{name}:{func}"


def _python_pipeline(fn: Any) -> tuple[Pipeline, ExecutionConfig]:
    from .engine.execution import ExecutionConfig
    from .engine.pipeline import Pipeline

    result = fn()
    if isinstance(result, tuple):
        pipeline, execution = result
    else:
        pipeline, execution = result, ExecutionConfig()
    if not isinstance(pipeline, Pipeline):
        raise ZephonError(
            "--pipeline: the function must return a Pipeline "
            "(or a (Pipeline, ExecutionConfig) tuple)"
        )
    return pipeline, execution


def tuned_runtime() -> RuntimeConfig:
    """The process tuning of a command other than ``serve`` (from the environment), applied
    at once: its pipeline and its workers run as the server's do."""
    from .runtime import from_environ

    runtime = from_environ(os.environ)
    runtime.apply()
    return runtime
