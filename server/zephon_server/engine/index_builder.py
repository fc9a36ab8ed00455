"""Building the shard index ahead of time: every shard of every dataset, in parallel.

``zephon index`` runs this so that the first server start is already a warm one. It lists
and stats every dataset's shards exactly as start-up does (:func:`.datasets.list_shards`),
then, on a pool of threads, makes sure each shard version has a valid index entry: an entry
that is already there and passes its checks is kept, anything else is built through the same
:meth:`.shards.ShardCache.ensure_entry` a server uses, so the files are identical whoever
wrote them. Last, each dataset's catalog is written (:mod:`.index_catalog`), with the
Parquet shards' columns the servers check the text column with, as a server writes it.

Threads, not processes: the work is reading files and numpy scans and decompressors that
release the GIL, and threads start at once (docs/decisions.md has the measurement). Every
entry is written atomically as soon as it is built, so a run that is killed loses at most the
shards in progress; running again skips every entry already written.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from .datasets import DatasetSpec, list_objects, list_shards, object_keys, shard_keys
from .errors import ConfigError
from .index_catalog import save_catalog, shared_columns
from .parquet_columns import Columns
from .shards import ShardCache
from .storage import is_url

logger = logging.getLogger(__name__)

#: What indexing one shard gives: its rows, its columns (Parquet) and whether it was built now.
Counted = tuple[int, Columns | None, bool]


@dataclass(frozen=True)
class ShardJob:
    """One shard version to index: its dataset, path, format, size and identity."""

    dataset: str
    path: str
    format: str
    size: int
    identity: str


@dataclass(frozen=True)
class BuildReport:
    """What a build did: shards indexed now (``built``) or found indexed (``reused``)."""

    datasets: int
    shards: int
    built: int
    reused: int
    rows: int
    bytes_total: int
    bytes_built: int
    seconds: float
    #: Per dataset, each shard's (path, rows, columns): what start-up checks
    #: (:mod:`.text_columns`).
    counted: tuple[tuple[tuple[str, int, Columns | None], ...], ...] = ()


def list_jobs(specs: Sequence[DatasetSpec], base_dir: str) -> list[list[ShardJob]]:
    """Every shard of every dataset (one list per dataset, in listing order), stat'ed now."""
    if not specs:
        raise ConfigError("datasets: at least one dataset is required (add a dataset spec)")
    base = os.path.abspath(base_dir)
    out: list[list[ShardJob]] = []
    for spec in specs:
        if is_url(spec.path):
            listed = list_objects(spec)
            out.append(
                [
                    ShardJob(spec.name, url, fmt, info.size, identity)
                    for (url, fmt, info), (_, identity, _) in zip(listed, object_keys(listed))
                ]
            )
            continue
        stats, keys = shard_keys(list_shards(spec, base))
        out.append(
            [
                ShardJob(spec.name, path, fmt, st.st_size, identity)
                for (path, identity, fmt), st in zip(keys, stats)
            ]
        )
    return out


def build_index(
    datasets: Sequence[Sequence[ShardJob]],
    cache: ShardCache,
    workers: int,
    on_shard: Callable[[ShardJob, bool], None] | None = None,
) -> BuildReport:
    """Make sure every shard of ``datasets`` has a valid entry in ``cache``'s index, with
    ``workers`` threads, then write each dataset's catalog. ``on_shard(job, built)`` is
    called (from a worker thread) as each shard is done. The first error stops the build
    and is raised; entries finished by then stay valid."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be an integer >= 1, got {workers!r}")
    start = time.monotonic()
    jobs = [job for listing in datasets for job in listing]
    seen: dict[Columns, Columns] = {}  # one copy of each schema, however many shards

    def one(job: ShardJob) -> Counted:
        rows, columns, built = cache.ensure_entry(job.path, job.format, job.identity)
        if on_shard is not None:
            on_shard(job, built)
        return rows, shared_columns(seen, columns), built

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zephon-index")
    try:
        futures: list[Future[Counted]] = [pool.submit(one, job) for job in jobs]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f in done and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        results = [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    pos = 0
    for listing in datasets:
        done_now = results[pos : pos + len(listing)]
        keys = [(j.path, j.identity, j.format) for j in listing]
        save_catalog(cache.index, keys, [r for r, _, _ in done_now], [c for _, c, _ in done_now])
        pos += len(listing)
    built = [job for job, (_, _, b) in zip(jobs, results) if b]
    return BuildReport(
        datasets=len(datasets),
        shards=len(jobs),
        built=len(built),
        reused=len(jobs) - len(built),
        rows=sum(r for r, _, _ in results),
        bytes_total=sum(j.size for j in jobs),
        bytes_built=sum(j.size for j in built),
        seconds=time.monotonic() - start,
        counted=_per_dataset(datasets, results),
    )


def _per_dataset(
    datasets: Sequence[Sequence[ShardJob]], results: Sequence[Counted]
) -> tuple[tuple[tuple[str, int, Columns | None], ...], ...]:
    """Each dataset's shards as (path, rows, columns), from the results of every job."""
    out, pos = [], 0
    for listing in datasets:
        done = results[pos : pos + len(listing)]
        out.append(tuple((job.path, rows, cols) for job, (rows, cols, _) in zip(listing, done)))
        pos += len(listing)
    return tuple(out)
