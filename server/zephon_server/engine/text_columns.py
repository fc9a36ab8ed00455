"""The text column of every Parquet shard, checked at start-up before the first batch.

A Parquet dataset reads its ``text_field`` column from every shard. A shard without it (the
column named otherwise, or not text) used to be found only when one of its rows was read:
under ``on_error: fail`` possibly hours into a run, under ``skip`` as a third of the data
dropped with one warning mid-run. Each shard's top-level columns are in its index entry and
in its dataset's catalog (:mod:`.index_catalog`), so start-up checks every shard, cold or
warm, local or on object storage, without reading a footer more than counting does.

The rule is the read path's (:func:`.parquet_columns.is_text_column`), so the check says
exactly which shards the reads would refuse:

* ``on_error: fail``: a :class:`~.errors.DataError` naming the dataset, the first shard
  without the column, how many there are, that shard's columns and the fix; start-up stops
  (``zephon explain``, ``dump`` and ``serve`` exit with status 2).
* ``on_error: skip``: one warning saying the same and that their rows will be skipped and
  counted as ``read_error``; the run is what it was without the check (the reads tombstone
  those rows as before), so what is served does not change.

A shard with no rows is never read, so it is not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import DataError
from .parquet_columns import EXPECTED, Columns, column_type, is_text_column, record_type

if TYPE_CHECKING:
    from .datasets import DatasetSpec

logger = logging.getLogger(__name__)

#: Columns named in a message at most (a wide table has thousands).
MAX_NAMED_COLUMNS = 20
FIX = "set the dataset's text_field to the column holding the text, or fix or remove those shards"
RECORD_FIX = (
    "set the dataset's record_columns to the columns that make each record, or fix or remove "
    "those shards"
)


def check_text_columns(
    spec: DatasetSpec,
    shards: Sequence[tuple[str, int]],
    columns: Sequence[Columns | None],
    records: bool = False,
) -> None:
    """Check that every Parquet shard (``columns`` not None) with rows has ``spec``'s
    ``text_field`` as a column of text (with ``records``, for ``render_chat``, or of lists or
    structs); ``shards``: each shard's (path, rows). See the module docstring for what
    happens when not."""
    read = spec.columns_read(records)
    lacking = [
        (shard, cols)
        for shard, cols in zip(shards, columns)
        if cols is not None and shard[1] and not all(is_text_column(cols, c, records) for c in read)
    ]
    if not lacking:
        return
    problem = _describe(spec, lacking, sum(c is not None for c in columns), records)
    fix = FIX if read == (spec.text_field,) else RECORD_FIX
    if spec.on_error == "fail":
        raise DataError(f"{problem}; {fix}")
    logger.warning(
        "%s; with on_error: skip their rows will be skipped and counted as read_error (%s)",
        problem,
        fix,
    )


def _describe(
    spec: DatasetSpec,
    lacking: list[tuple[tuple[str, int], Columns]],
    parquet: int,
    records: bool,
) -> str:
    """Which shards lack the column and what the first one has."""
    (first, _), cols = lacking[0]
    rows = sum(n for (_, n), _ in lacking)
    read = spec.columns_read(records)
    column = next(c for c in read if not is_text_column(cols, c, records))
    typ = column_type(cols, column) or ""
    chat = record_type(typ) and not records
    return (
        f"dataset {spec.name!r}: {len(lacking)} of its {parquet} Parquet shards ({rows} rows) "
        f"{'has' if len(lacking) == 1 else 'have'} no text column {column!r} "
        f"({EXPECTED[records]}); the first is {first}, whose columns are {_named(cols)}"
        + (
            f" (a {typ.split('<')[0]} column is read by render_chat, for chat records)"
            if chat
            else ""
        )
    )


def _named(columns: Columns) -> str:
    """``[name: type, ...]``, the first :data:`MAX_NAMED_COLUMNS` of them."""
    named = ", ".join(f"{name}: {typ}" for name, typ in columns[:MAX_NAMED_COLUMNS])
    more = len(columns) - MAX_NAMED_COLUMNS
    return f"[{named}{f', ... ({more} more)' if more > 0 else ''}]"
