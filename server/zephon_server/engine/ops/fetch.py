"""``fetch``: the implicit first operator; reads the rows a micro-batch points at.

Pointers are grouped by shard so each shard is touched once per micro-batch and only the
requested rows are read (the shard cache keeps JSONL line indexes and decompressed shards).
JSONL rows come out as ``{"raw": bytes}``, Parquet rows as ``{"text": str | None}``;
``decode_text`` turns both into text. In a ``render_chat`` pipeline a Parquet row may also be
a list or struct value, or, for a dataset with ``record_columns``, a ``{column: value}``
record of those columns. A row larger than its dataset's ``max_document_bytes``
(a plain JSONL one is not even read) follows the dataset's ``on_error``: a :class:`DataError`
naming the file, line, size and limit, or a tombstone with reason ``too_large``. A row of a
Parquet row group that cannot be read (:mod:`..parquet_rows`) follows it too, with reason
``read_error``: a damaged row group costs its own rows, the shard's others are served.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

from ..datasets import register_storage
from ..decompression import FIX
from ..errors import DataError, ShardChanged
from ..parquet_rows import Unreadable
from ..records import SampleRecord
from ..shards import Oversized
from .bad_record import on_bad_record
from .base import OpContext, Operator, OpTraits

log = logging.getLogger(__name__)


class Fetch(Operator):
    """Reads source rows for pointer records (inserted by the planner; never configured)."""

    op_name = "fetch"
    # Fetch heads the fused fetch → decode → tokenize step, so this is that step's call size:
    # 256 documents amortise the per-call work (shard grouping, coalesced reads, task hand-off,
    # reordering) better than 64 (docs/decisions.md, "Fusion", has the measurement).
    default_microbatch_size = 256

    def __init__(self, *, records: bool = False) -> None:
        super().__init__()
        #: The next operator reads whole records (``render_chat``): a Parquet text_field may
        #: be a list or struct column (chat datasets' ``messages``), handed over as it is.
        self.records = records

    def traits(self) -> OpTraits:
        # Records leave in input order; count-based grouping: fusable with its neighbours.
        return OpTraits(preserves_cursor_order=True, fusable=True)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._datasets = ctx.datasets
        register_storage(ctx.datasets)  # object-store buckets' options, in this process too
        self._cache = ctx.shard_cache
        # Shards (and Parquet row groups) whose skipped rows were logged.
        self._unreadable: set[Hashable] = set()
        # Per dataset, its shards whose last read failed whole (gone, unreadable), and how
        # many reads of it in a row failed so.
        self._gone: dict[int, set[int]] = {}
        self._failed_reads: dict[int, int] = {}

    def process_many(self, elems: list[Any]) -> list[Any]:
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, rec in enumerate(elems):
            doc = rec.meta.doc
            groups[(doc.dataset, doc.shard)].append(i)
        out: list[Any] = [None] * len(elems)
        for (ds_index, shard_index), positions in groups.items():
            info = self._datasets[ds_index]
            shard = info.shards[shard_index]
            rows = [elems[i].meta.doc.row for i in positions]
            limit = info.spec.max_document_bytes
            try:
                values = self._read(shard, rows, info.spec, limit)
            except DataError as exc:
                if info.spec.on_error != "skip" or isinstance(exc, ShardChanged):
                    raise  # a changed file is other data, not a bad record: never skipped
                self._count_unreadable(info, ds_index, shard_index, exc)
                self._warn_unreadable(shard.path, len(positions), exc)
                for i in positions:
                    out[i] = elems[i].tombstone("read_error")
                continue
            self._gone.get(ds_index, set()).discard(shard_index)
            self._failed_reads[ds_index] = 0
            key = "text" if shard.format == "parquet" else "raw"
            for i, value in zip(positions, values):
                if type(value) is Oversized:
                    out[i] = _too_large(elems[i], info, value.size)
                elif type(value) is Unreadable:
                    out[i] = self._damaged(elems[i], info, value)
                else:
                    out[i] = SampleRecord({key: value}, elems[i].meta)
        return out

    def _read(self, shard: Any, rows: list[int], spec: Any, limit: int) -> list[Any]:
        """The rows' values: of the dataset's text field, or for a Parquet shard whose dataset
        has ``record_columns`` (read by ``render_chat``) a ``{column: value}`` record per row
        (a row with an oversized or unreadable column stands for that column's problem)."""
        columns = spec.columns_read(self.records)
        if shard.format != "parquet" or columns == (spec.text_field,):
            field = spec.text_field
            return list(self._cache.read_rows(shard, rows, field, limit, records=self.records))
        read = [self._cache.read_rows(shard, rows, c, limit, records=True) for c in columns]
        out: list[Any] = []
        for values in zip(*read):
            bad = next((v for v in values if type(v) in (Oversized, Unreadable)), None)
            out.append(bad if bad is not None else dict(zip(columns, values)))
        return out

    def _count_unreadable(self, info: Any, ds_index: int, shard_index: int, exc: DataError) -> None:
        """Note a shard whose read failed whole; :class:`DataError` once every shard of its
        dataset has, over more reads in a row than a pass of a few chunks per shard makes
        (the dataset is gone: ``on_error: skip`` is for bad records and shards, and skipping
        a whole dataset would spin on it, under ``exhaustion: repeat`` forever, without a
        batch; a read failing now and then, as object storage's can, is skipped as before)."""
        gone = self._gone.setdefault(ds_index, set())
        gone.add(shard_index)
        failed = self._failed_reads[ds_index] = self._failed_reads.get(ds_index, 0) + 1
        if len(gone) >= len(info.shards) and failed >= 2 * len(info.shards) + GONE_AFTER_READS:
            raise DataError(
                f"dataset {info.spec.name!r}: none of its {len(info.shards)} shards can be read "
                f"(the last: {exc}); on_error: skip skips bad records and shards, not a whole "
                "dataset: restore its files, or remove the dataset from the pipeline"
            ) from exc

    def _warn_unreadable(self, path: str, rows: int, exc: DataError) -> None:
        """Log an unreadable shard's skipped rows once per shard and worker (every read of it
        fails alike: a line per read flooded the log); every row is still counted."""
        if not self._first_time(path):
            return
        log.warning(
            "skipping %d rows of unreadable shard (its later rows that cannot be read either are "
            "skipped and counted as read_error without a line each): %s",
            rows,
            exc,
        )

    def _damaged(self, rec: SampleRecord, info: Any, marker: Unreadable) -> SampleRecord:
        """The tombstone of a row of a damaged Parquet row group (logged once per row group
        and worker); raises naming the file, row, row group and fix under ``fail``."""
        if info.spec.on_error == "skip" and self._first_time((marker.path, marker.row_group)):
            log.warning(
                "skipping the rows of a damaged Parquet row group (the shard's other row "
                "groups are served; this one's rows are counted as read_error without a line "
                "each): %s",
                marker.message(),
            )
        return on_bad_record(rec, info, "read_error", marker.describe(), fix=FIX)

    def _first_time(self, key: Hashable) -> bool:
        """Whether ``key`` (a shard, a row group) is to be logged now: not yet, and fewer than
        :data:`MAX_UNREADABLE_LOGGED` logged."""
        if key in self._unreadable or len(self._unreadable) >= MAX_UNREADABLE_LOGGED:
            return False
        self._unreadable.add(key)
        return True


#: Unreadable shards and row groups logged per worker (a bound on the set of those logged;
#: past it, their rows are only counted).
MAX_UNREADABLE_LOGGED = 1024
#: Failed reads in a row, beyond two per shard, before a dataset none of whose shards can be
#: read is given up (:meth:`Fetch._count_unreadable`).
GONE_AFTER_READS = 16


def _too_large(rec: SampleRecord, info: Any, size: int) -> SampleRecord:
    limit = info.spec.max_document_bytes
    return on_bad_record(
        rec,
        info,
        "too_large",
        f"document of {size} bytes is larger than max_document_bytes ({limit})",
        fix=f"raise max_document_bytes on dataset {info.spec.name!r} or remove the document",
    )
