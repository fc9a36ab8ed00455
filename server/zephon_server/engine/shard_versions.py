"""Checks that a shard is the version it is read as: identities now, and loads bracketed by
two of them; and what such a load opens, a local file or an object.

Everything the shard cache keeps is kept under a shard's identity (:mod:`.identity`); a load
(a decompression, a footer, a row group, a spill file reused) happens only between two
``stat`` calls (HEADs for an object) that find that identity, so nothing read from another
version is ever cached or returned (:class:`~.errors.ShardChanged` instead).
"""

from __future__ import annotations

import errno
import os
import stat as stat_module
from collections.abc import Callable
from typing import Any, TypeVar

from .decompression import Frame, SinkFactory, decompress_bytes, decompress_shard, decompress_stream
from .errors import DataError, ShardChanged
from .identity import describe_change, stat_identity
from .storage import is_url, shard_io

_T = TypeVar("_T")


#: What to do about a shard that cannot be opened or read (gone, permissions, a directory).
UNREADABLE_FIX = (
    "restore the file or its permissions for the server's user, or remove it from the "
    "dataset (on_error: skip skips and counts its rows)"
)


def unreadable(path: str, problem: object) -> DataError:
    """The error for shard ``path`` that cannot be read, naming ``problem`` and the fix."""
    return DataError(f"cannot read shard {path}: {problem}; {UNREADABLE_FIX}")


def identity_now(path: str) -> str:
    """The identity of ``path`` as it is now (:class:`DataError` when it cannot be stat'ed)."""
    if is_url(path):
        return shard_io.identity_now(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise unreadable(path, exc) from exc
    return regular_identity(path, st)


def regular_identity(path: str, st: os.stat_result) -> str:
    """The identity of a regular file; anything else in a shard's place is unreadable (a
    plain :class:`DataError`, which ``on_error: skip`` may skip), not a changed file."""
    if stat_module.S_ISDIR(st.st_mode):
        raise unreadable(path, IsADirectoryError(errno.EISDIR, "Is a directory"))
    if not stat_module.S_ISREG(st.st_mode):
        raise unreadable(path, "not a regular file")
    return stat_identity(st)


def checked_load(path: str, identity: str, load: Callable[[], _T]) -> _T:
    """``load()`` of version ``identity`` of ``path``: the file must have that identity before
    and still after (a change in between is caught by the second ``stat``)."""
    before = identity_now(path)
    if before != identity:
        raise changed(path, identity, before)
    try:
        value = load()
    except OSError as exc:
        raise unreadable(path, exc) from exc
    except DataError as exc:
        if is_url(path) and not isinstance(exc, ShardChanged):  # a failed read: rewritten?
            now = identity_now(path)
            if now != identity:
                raise changed(path, identity, now) from exc
        raise
    after = identity_now(path)
    if after != before:
        raise ShardChanged(
            f"shard {path} changed while it was being read ({describe_change(before, after)}); "
            "is a writer still writing it? Data files must not change while a server uses "
            "them: wait until the file is complete, then restart"
        )
    return value


def changed(path: str, expected: str, found: str) -> ShardChanged:
    """The error for a shard read (or counted) as ``expected`` that is now ``found``."""
    return ShardChanged(
        f"shard {path} changed after it was indexed ({describe_change(expected, found)}); "
        "its rows are never read through the index of another version. Data files must not "
        "change while a server uses them: restore the original file, or restart the server to "
        "use the new content (a resume onto the changed data is refused: start a new run)"
    )


def decompress_version(
    path: str,
    fmt: str,
    identity: str,
    frames: list[Frame] | None = None,
    sink: SinkFactory | None = None,
    stream_over: int | None = None,
) -> Any:
    """The content of a local compressed shard, or of an object: downloaded whole when it is
    at most ``stream_over`` bytes, else decoded as its ranged GETs arrive (never held
    whole). ``sink`` as :func:`~.decompression.decompress_shard`'s."""
    if not is_url(path):
        return decompress_shard(path, fmt, frames, sink)
    size = shard_io.size_of(identity)
    if stream_over is not None and size > stream_over:
        source = shard_io.stream(path, identity)
        return decompress_stream(source, path, fmt, size, frames, sink)
    return decompress_bytes(shard_io.read_all(path, identity), path, fmt, frames, sink)


def parquet_source(path: str, identity: str) -> Any:
    """What ``pq.ParquetFile`` opens: the path, or a file object over the object."""
    return shard_io.parquet_file(path, identity) if is_url(path) else path
