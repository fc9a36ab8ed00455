"""``zephon index``: build the shard index of a pipeline's datasets ahead of time.

``zephon index --config P [--index-dir D] [--workers N]`` lists every dataset's shards the way
``zephon serve`` does and writes each shard's index entry and each dataset's catalog into the
index directory (the same default as the other commands: the config's ``index_dir``, else
``<state-dir>/index`` with ``--state-dir``, else the per-user cache directory). A server
started afterwards on the same directory reads no shard to start. Progress goes to stderr
(:mod:`.progress`), one summary line to stdout. Killed and run again, it skips every entry
already written; run on an index that is complete, it only checks it. Then it brings the
directory within its budget (``--index-max-bytes``, :mod:`.engine.index_budget`), never
removing what the pipeline's datasets need.

``zephon index --prune`` builds nothing: it lists the datasets (their catalogs and entries
are kept), removes every orphan entry and unusable catalog older than an hour, then least
recently used catalogs while the directory is over budget, and prints what it removed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .engine.errors import DataError, ZephonError

if TYPE_CHECKING:
    from .engine.datasets import DatasetSpec
    from .engine.execution import ExecutionConfig
    from .engine.index_builder import BuildReport, ShardJob
    from .engine.index_dir import IndexDir
    from .engine.shard_index import ShardIndex
    from .engine.shards import ShardCache

DEFAULT_PROGRESS_INTERVAL = 10.0


def default_workers() -> int:
    """Shards indexed at once by default: the CPUs of this machine (at most 8)."""
    return max(1, min(8, os.cpu_count() or 1))


def add_index_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``zephon index``."""
    from .pipeline_flags import index_dir_arg

    p.add_argument("--config", help="pipeline YAML file")
    p.add_argument("--pipeline", help="Python pipeline, file.py:function or module:function")
    index_dir_arg(p)
    p.add_argument(
        "--state-dir",
        default=None,
        help="without --index-dir (nor index_dir in the config): build into <state-dir>/index, "
        "where zephon serve --state-dir looks",
    )
    p.add_argument(
        "--workers",
        dest="index_workers",
        type=int,
        default=None,
        metavar="N",
        help="shards indexed at once (threads; default: the number of CPUs, at most 8)",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="build nothing: remove index entries no catalog refers to (shards rewritten or "
        "removed), then least recently used catalogs while the directory is over "
        "--index-max-bytes, keeping what this pipeline's datasets need; prints what it removed",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=DEFAULT_PROGRESS_INTERVAL,
        metavar="SECONDS",
        help="seconds between progress lines when stderr is not a terminal (on a terminal "
        "the line updates in place; 0: only the last line)",
    )


def cmd_index(args: argparse.Namespace) -> int:
    """Build every dataset's index entries and catalog; prints one summary line."""
    from .engine.datasets import register_buckets
    from .engine.index_budget import enforce
    from .engine.index_builder import list_jobs
    from .engine.shard_index import ShardIndex
    from .engine.shards import ShardCache
    from .pipeline_flags import load_pipeline, tuned_runtime
    from .progress import human_bytes

    interval = args.progress_interval
    if not interval >= 0:
        raise ZephonError(f"--progress-interval must be >= 0 seconds, got {interval!r}")
    pipeline, execution = load_pipeline(args, tuned_runtime())
    register_buckets(pipeline.datasets)  # an index in a dataset's bucket uses its options
    store = _writable_store(execution)
    datasets = list_jobs(pipeline.datasets, pipeline.base_dir)
    cache = ShardCache(index=ShardIndex(store), max_open_indexes=0)
    if args.prune:
        return _prune(cache.index, datasets)
    workers = default_workers() if args.index_workers is None else args.index_workers
    report = _build_with_progress(datasets, cache, workers, interval)
    if store.stopped is not None:  # entries built after it stayed in memory: not saved
        raise ZephonError(
            f"zephon index: writing in index directory {store.root} failed ({store.stopped}), "
            "so the index is not complete there and a server would index again at start; "
            "fix the cause (free disk space, or move what is in the way) and run zephon "
            "index again: it keeps what it saved"
        )
    rate = report.bytes_built / max(report.seconds, 1e-9)
    print(
        f"indexed {report.shards} shards of {report.datasets} dataset(s) in {store.root}: "
        f"{report.built} built, {report.reused} already indexed; {report.rows} rows, "
        f"{human_bytes(report.bytes_total)} ({human_bytes(report.bytes_built)} read) in "
        f"{report.seconds:.2f} s ({rate / 1e6:.1f} MB/s)"
    )
    pruned = enforce(cache.index)
    if pruned is not None and pruned.bytes_removed:
        print(pruned.summary())
    records = any(op.op_name == "render_chat" for op in pipeline.ops)
    _check_text_columns(pipeline.datasets, report, records)
    return 0


def _check_text_columns(specs: Sequence[DatasetSpec], report: BuildReport, records: bool) -> None:
    """Say now what a server's start-up would refuse or skip: Parquet shards without the text
    column (:mod:`.engine.text_columns`; the index itself is complete either way)."""
    from .engine.text_columns import check_text_columns

    for spec, counted in zip(specs, report.counted):
        try:
            shards = [(p, n) for p, n, _ in counted]
            check_text_columns(spec, shards, [c for _, _, c in counted], records)
        except DataError as exc:
            print(
                f"zephon index: warning: {exc}; a server with this config stops at start-up "
                "until then",
                file=sys.stderr,
            )


def _writable_store(execution: ExecutionConfig) -> IndexDir:
    """The index directory ``zephon index`` builds in, opened, its leftover temporary files
    swept (:class:`ZephonError` when there is none to build in or it cannot be written)."""
    from .engine.index_dir import NONE, location_write_problem, open_index_dir

    where = execution.index_dir
    if where is None or where == NONE:
        raise ZephonError(
            "zephon index: --index-dir none keeps the shard index in memory only, so there is "
            "nothing to build; give a directory (--index-dir DIR)"
        )
    problem = location_write_problem(where)
    if problem is not None:
        raise ZephonError(
            f"zephon index: cannot write in index directory {where} "
            f"({problem}); make it writable or pass another --index-dir"
        )
    store = open_index_dir(
        where, max_bytes=execution.index_max_bytes, spill_max_bytes=execution.spill_max_bytes
    )
    assert store is not None
    store.sweep_temporary()
    return store


def _build_with_progress(
    datasets: Sequence[Sequence[ShardJob]], cache: ShardCache, workers: int, interval: float
) -> BuildReport:
    """Build the entries of every shard listed, a progress bar on stderr; the build report."""
    from .engine.index_builder import build_index
    from .progress import ProgressBar

    jobs = [job for listing in datasets for job in listing]
    bar = ProgressBar(
        "index",
        "shards",
        len(jobs),
        sum(j.size for j in jobs),
        sys.stderr,
        tty=sys.stderr.isatty(),
        interval=interval,
    ).start()
    try:
        return build_index(
            datasets, cache, workers, on_shard=lambda job, built: bar.advance(job.size, built)
        )
    finally:
        bar.close()


def _prune(index: ShardIndex, datasets: Sequence[Sequence[ShardJob]]) -> int:
    """``zephon index --prune``: the pipeline's catalogs pinned, every old orphan removed,
    then the budget enforced; prints the report."""
    from .engine.index_budget import prune
    from .engine.index_catalog import catalog_name

    pinned = {}
    for jobs in datasets:
        listing = [(j.path, j.identity, j.format) for j in jobs]
        pinned[catalog_name(listing)] = listing
    report = prune(index.store, pinned, all_orphans=True)
    print(report.summary())
    if report.over_budget:
        print(
            f"zephon index: the datasets in use need {report.bytes_after} bytes of index, more "
            f"than the budget of {report.max_bytes} bytes; raise --index-max-bytes",
            file=sys.stderr,
        )
    return 0
