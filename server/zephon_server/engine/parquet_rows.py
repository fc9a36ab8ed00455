"""Reading a Parquet shard: its footer, one row group, and what a damaged one costs (its own
rows).

A row group is the unit a Parquet shard is read (and cached) in: its text column is decoded
whole (:mod:`.parquet_columns` turns it into Python values).

* **Integrity.** Every file is opened with ``page_checksum_verification``: a data page whose
  CRC does not match (files written with page checksums, pyarrow's
  ``write_page_checksum=True``) fails to read, as a page that does not decompress does.
  Without checksums only compression can tell, and not always (snappy, zstd and lz4 pages
  carry no checksum of their own); an uncompressed file without them has no check at all:
  damage there is read as changed text.
* **A damaged row group** (a page that does not decompress, decode or match its checksum) is
  a :class:`DamagedRowGroup`; the shard cache answers each of its rows with an
  :class:`Unreadable` marker and reads the shard's other row groups as usual, so ``fetch``
  applies the dataset's ``on_error`` to those rows only. Which rows are lost depends only on
  the file, never on how reads are grouped (micro-batches, runners, workers, a resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .decompression import FIX
from .errors import DataError
from .parquet_columns import plain


def open_file(source: Any, metadata: Any = None) -> Any:
    """``pyarrow.parquet.ParquetFile`` over ``source`` (a path or a file object) that checks
    every page's CRC where the writer wrote one."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, metadata=metadata, page_checksum_verification=True)


def read_footer(source: Any, path: str) -> tuple[Any, np.ndarray, Any]:
    """(FileMetaData, cumulative row-group bounds, Arrow schema) of Parquet shard ``path``;
    :class:`DataError` when it is not a whole Parquet file."""
    import pyarrow as pa

    try:
        pf = open_file(source)
    except (OSError, pa.ArrowException) as exc:
        why = _NESTED if "too deeply nested" in str(exc) else f"a damaged or cut-short file: {FIX}"
        raise DataError(f"cannot read Parquet shard {path}: {exc} ({why})") from exc
    md = pf.metadata
    sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return md, bounds, pf.schema_arrow


_NESTED = (
    "its columns nest deeper than pyarrow reads any file: write the shard with flatter columns "
    "(a chat column is list<struct<role, content>>), or remove it from the dataset"
)


@dataclass(frozen=True)
class Unreadable:
    """Stands in for a row of a row group that cannot be read: rows ``first`` to ``end - 1``
    (row group ``row_group``) of shard ``path``; ``problem`` is pyarrow's message."""

    path: str
    row_group: int
    first: int
    end: int
    problem: str

    def describe(self) -> str:
        """What is wrong, for a message that names the file and row already."""
        return (
            f"its row group {self.row_group} (rows {self.first}-{self.end - 1}) cannot be "
            f"read ({self.problem}): the file is damaged"
        )

    def message(self) -> str:
        """What is wrong and the fix, naming the file."""
        return (
            f"cannot read row group {self.row_group} (rows {self.first}-{self.end - 1}) of "
            f"Parquet shard {self.path} ({self.problem}): the file is damaged; {FIX}"
        )


class DamagedRowGroup(DataError):
    """A row group of a Parquet shard cannot be read; ``marker`` stands in for its rows."""

    def __init__(self, marker: Unreadable) -> None:
        self.marker = marker
        super().__init__(marker.message())

    def __reduce__(self) -> tuple[type, tuple[Unreadable]]:
        return (type(self), (self.marker,))


def read_column(
    source: Any, metadata: Any, rg: int, text_field: str, path: str, bounds: np.ndarray
) -> Any:
    """Column ``text_field`` of row group ``rg`` (``bounds``: the cumulative row-group
    bounds), dictionary-decoded; :class:`DamagedRowGroup` when it cannot be read."""
    import pyarrow as pa

    try:
        table = open_file(source, metadata).read_row_group(rg, columns=[text_field])
    except (OSError, pa.ArrowException) as exc:
        first, end = int(bounds[rg]), int(bounds[rg + 1])
        raise DamagedRowGroup(Unreadable(path, rg, first, end, str(exc))) from exc
    return plain(table.column(0))
