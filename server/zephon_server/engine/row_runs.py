"""Reading rows of a plain JSONL file at known offsets, in coalesced ``pread`` runs.

Rows close together in the file (gaps under :data:`COALESCE_GAP`) are read with one
``pread`` of at most :data:`MAX_RUN` bytes (unless one row is larger), then cut into rows.
Used for plain JSONL shards and for the spill files of large compressed ones
(:mod:`.spill`), whose content is plain JSONL too.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import DataError, ShardChanged

COALESCE_GAP = 1 << 16  # rows closer than this are read with one pread
MAX_RUN = 1 << 23  # never read more than this in one pread unless a single row is larger


def pread_rows(
    fd: int, path: str, order: list[int], lo: list[int], hi: list[int], out: list[Any]
) -> None:
    """Put the bytes ``[lo[i], hi[i])`` of file ``fd`` into ``out[i]`` for every ``i`` of
    ``order`` (ascending offsets); :class:`DataError` naming ``path`` when the file is
    shorter than the offsets say, ``OSError`` when it cannot be read."""
    run: list[int] = []
    run_lo = run_hi = 0
    for i in order:
        a, b = lo[i], hi[i]
        if run and (a - run_hi > COALESCE_GAP or max(b, run_hi) - run_lo > MAX_RUN):
            _pread_run(fd, path, run, run_lo, run_hi, lo, hi, out)
            run = []
        if not run:
            run_lo, run_hi = a, b
        run.append(i)
        run_hi = max(run_hi, b)
    _pread_run(fd, path, run, run_lo, run_hi, lo, hi, out)


def _pread_run(
    fd: int,
    path: str,
    run: list[int],
    run_lo: int,
    run_hi: int,
    lo: list[int],
    hi: list[int],
    out: list[Any],
) -> None:
    # One byte more on each side: the newlines the row boundaries must fall on.
    start = run_lo - 1 if run_lo else 0
    buf = os.pread(fd, run_hi + 1 - start, start)
    if len(buf) < run_hi - start:
        raise DataError(
            f"shard {path} is shorter than when it was indexed (file changed while in use; "
            "restart the server after modifying data)"
        )
    for i in run:
        a, b = lo[i] - start, hi[i] - start
        # The byte before a row (but the first) and the one after it (but at the end of the
        # file) are newlines, or the offsets are not this content's.
        if (a and buf[a - 1] != 10) or (b < len(buf) and buf[b] != 10):
            raise ShardChanged(misaligned(path, lo[i], hi[i]))  # other data: never skipped
        out[i] = buf[a:b]


def misaligned(path: str, lo: int, hi: int) -> str:
    """The error for a row whose indexed bytes ``[lo, hi)`` are not a line of the file."""
    return (
        f"shard {path}: the row indexed at bytes {lo}-{hi} is not a line of the file: its "
        "content changed while its size and modification time stayed the same (rewritten "
        "in place with its time put back, e.g. by touch -r or a copy keeping times). If the "
        "new content is right, give the file a new modification time (touch it) so it is "
        "indexed again, and start a new run; else restore the original file"
    )
