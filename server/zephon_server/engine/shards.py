"""Reading rows of shard files by index: JSONL (plain, gzip, zstd) and Parquet.

One :class:`ShardCache` per process serves every read. It keeps what makes random access cheap:

* plain JSONL: a *line index* (``int64`` start offsets, 8 bytes per row) built in one pass the
  first time the shard is counted or read; rows are then read with ``pread`` at their offsets
  and the file is never rescanned.
* ``.jsonl.gz`` / ``.jsonl.zst``: the whole shard is decompressed once and kept, with its line
  index, in an LRU bounded by ``max_bytes`` (least recently used shards are evicted); one whose
  content is over ``spill_threshold`` (64 MiB; ``max_bytes`` if smaller, at least 1 MiB) is
  stream-decompressed once into a spill file instead and read from it by offset
  (:mod:`.spill`). A shard
  that does not decompress completely (truncated, trailing garbage, corrupt) is a
  :class:`~.decompression.IncompleteShardError` when it is first counted, whatever the
  dataset's ``on_error``: its row count cannot be known. A zstd shard of several frames whose
  index entry is known is read frame by frame instead (:mod:`.zstd_frames`).
* Parquet: row counts come from the footer; rows are read by row group, only the requested
  text column, and decoded row-group columns share the same LRU budget. Page checksums are
  verified, and a row group that cannot be read costs only its own rows (an
  :class:`~.parquet_rows.Unreadable` marker each; :mod:`.parquet_rows`).

What counting builds (row counts, line starts, zstd frame tables, Parquet row-group bounds and
columns) is an *index entry* of the cache's :class:`~.shard_index.ShardIndex`, persisted in
the index directory when there is one: a later start, or another process, counts the shard
from its entry without reading the shard. Line indexes are opened (memory-mapped) when a
shard is read and kept in an LRU of ``max_open_indexes`` shards, so memory does not grow with
the number of rows of the corpus.

A JSONL row is every ``\\n``-terminated line (blank lines included) plus a final unterminated
non-empty line; it is returned as raw ``bytes`` without the newline, decoding happens later.
Parquet rows are returned as ``str`` (or ``bytes`` for binary columns, ``None`` for nulls).
A row larger than the caller's ``max_document_bytes`` comes back as an :class:`Oversized`
marker instead; for plain JSONL its bytes are not even read (the line index knows its size),
and a Parquet value is never made into a Python object (its size comes from Arrow).

Everything cached is cached under the shard's *identity* (size and modification time, see
:mod:`.identity`): a plain JSONL read calls ``fstat`` on the file it opened and compares it with
the :class:`~.datasets.ShardInfo`, and a compressed shard, a Parquet footer or row group is
loaded only between two ``stat`` calls that find the identity it is wanted under. A file that
changed raises :class:`~.errors.ShardChanged`; no row is ever read through the index of
another version of the file.

A shard path may also be an object-store URL (``s3://bucket/key``): the same caches and
checks apply, and the reads go through :mod:`.storage.shard_io` (ranged GETs; plain JSONL rows
through block-aligned reads cached in the same LRU; the identity is the object's size and
ETag, checked by a HEAD before and after every load).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .byte_lru import ByteLRU
from .decompression import Frame, decompress_shard
from .errors import DataError, ShardChanged
from .index_dir import IndexDir
from .line_index import index_lines, line_starts
from .open_indexes import OpenIndexes
from .parquet_columns import Columns, column_values, schema_columns
from .parquet_columns import check_field as _check_field
from .parquet_footers import FooterCache
from .parquet_rows import DamagedRowGroup, Unreadable, read_column, read_footer
from .row_runs import pread_rows
from .shard_index import IndexEntry, ShardIndex
from .shard_versions import changed as _changed
from .shard_versions import checked_load as _checked_load
from .shard_versions import decompress_version as _decompress_version
from .shard_versions import identity_now as _identity_now
from .shard_versions import parquet_source as _parquet_source
from .shard_versions import regular_identity as _regular_identity
from .shard_versions import unreadable
from .spill import (
    DEFAULT_THRESHOLD,
    MIN_THRESHOLD,
    SpillDir,
    Spilled,
    SpillSink,
    Unspilled,
    spill_error,
)
from .storage import is_url, shard_io
from .zstd_frames import frame_rows, read_frame

if TYPE_CHECKING:
    from .datasets import ShardInfo

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

JSONL = "jsonl"
JSONL_GZ = "jsonl.gz"
JSONL_ZST = "jsonl.zst"
PARQUET = "parquet"
FORMATS: tuple[str, ...] = (JSONL, JSONL_GZ, JSONL_ZST, PARQUET)
EXTENSIONS: dict[str, str] = {
    ".jsonl": JSONL,
    ".jsonl.gz": JSONL_GZ,
    ".jsonl.zst": JSONL_ZST,
    ".parquet": PARQUET,
}
DEFAULT_MAX_BYTES = 1 << 30
#: Line indexes (and other index entries) kept open at once, per cache.
DEFAULT_MAX_OPEN_INDEXES = 64

_LOCK_STRIPES = 64
_PY_OBJECT_OVERHEAD = 56  # rough size of a small Python str beyond its characters


@dataclass(frozen=True)
class Oversized:
    """Stands in for a row larger than the ``max_document_bytes`` it was read with.

    ``size`` is the row's length in bytes (a JSONL line without its newline, a Parquet
    value's UTF-8 or binary length)."""

    size: int


#: What a read row is: JSONL bytes, a Parquet value, or the marker of a too-large row or of
#: a row of a damaged Parquet row group.
Row = bytes | str | None | Oversized | Unreadable


def infer_format(path: str) -> str | None:
    """The shard format implied by a file name's extension, or ``None`` if unsupported."""
    name = path.lower()
    for ext in sorted(EXTENSIONS, key=len, reverse=True):
        if name.endswith(ext):
            return EXTENSIONS[ext]
    return None


def _decompress(path: str, fmt: str, frames: list[Frame] | None = None) -> bytes | bytearray:
    """The whole, verified content of a gzip or zstd shard (see :mod:`.decompression`)."""
    return decompress_shard(path, fmt, frames)


def _index_version(path: str, identity: str) -> np.ndarray:
    """:func:`index_lines` of a local file or of an object (streamed in ranged GETs)."""
    return shard_io.index_lines(path, identity) if is_url(path) else index_lines(path)


def _check_rows(path: str, idx: np.ndarray, n: int) -> None:
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise DataError(f"shard {path}: row {bad} out of range (the shard has {n} rows)")


class ShardCache:
    """Thread-safe, per-process reader of shard rows with bounded caches.

    ``max_bytes`` bounds decompressed JSONL shards, zstd frames, object-store blocks and
    decoded Parquet row groups (a :class:`~.byte_lru.ByteLRU`). ``index`` holds the shards'
    index entries (default: in memory only); ``max_open_indexes`` bounds the entries kept
    open; Parquet footers are kept in a bounded LRU (:mod:`.parquet_footers`).
    Counters ``hits``, ``misses``, ``evictions``, ``index_builds``, ``decompressions``,
    ``frame_reads``, ``footer_reads``, ``row_group_reads`` and ``bytes_cached`` are read as
    attributes for metrics. Pickling a cache yields an empty cache with the same budget and
    index directory, so operators holding one can cross processes.
    """

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        index: ShardIndex | None = None,
        max_open_indexes: int = DEFAULT_MAX_OPEN_INDEXES,
        spill: SpillDir | None = None,
        spill_threshold: int | None = None,
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"ShardCache max_bytes must be an int >= 0, got {max_bytes!r}")
        n = max_open_indexes
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"ShardCache max_open_indexes must be an int >= 0, got {n!r}")
        self.max_bytes = max_bytes
        self.max_open_indexes = max_open_indexes
        self.index = index if index is not None else ShardIndex(IndexDir(None))
        self._spill = spill
        self._derived_spill: SpillDir | None = None
        self._spill_threshold = spill_threshold
        self.spill_threshold = (
            max(MIN_THRESHOLD, min(DEFAULT_THRESHOLD, max_bytes))
            if spill_threshold is None
            else spill_threshold
        )
        self.spills = 0
        self.spill_hits = 0
        self.misses = 0
        self.index_builds = 0
        self.decompressions = 0
        self.frame_reads = 0
        self.footer_reads = 0
        self.row_group_reads = 0
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        self._lru = ByteLRU(max_bytes)
        # Entry locks are taken before (never while holding) an LRU stripe.
        self._entries = OpenIndexes(self.index, max_open_indexes, self._build_entry)
        self._counts: dict[tuple[str, str, str], int] = {}  # (path, format, identity) -> rows
        self._footers = FooterCache()

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            self.__class__,
            (
                self.max_bytes,
                ShardIndex(self.index.store),
                self.max_open_indexes,
                self._spill,
                self._spill_threshold,
            ),
        )

    @property
    def spill(self) -> SpillDir:
        """Where large compressed shards are decompressed to (:mod:`.spill`): the one given,
        else the index directory's ``spill/`` (or a temporary directory)."""
        if self._spill is not None:
            return self._spill
        derived = self._derived_spill  # follows the index directory's budget
        if derived is None or derived.max_bytes != self.index.store.spill_max_bytes:
            derived = self._derived_spill = SpillDir.for_index(self.index.store)
        return derived

    # ------------------------------------------------------------------ public API

    def num_rows(self, shard_path: str, fmt: str, identity: str | None = None) -> int:
        """Number of rows of a shard; builds (and keeps) the index that reading reuses.

        ``identity``: the file version to count (default: the file as it is now); a file that
        is not that version raises :class:`~.errors.ShardChanged`.
        """
        if identity is None:
            identity = _identity_now(shard_path)
        key = (shard_path, fmt, identity)
        with self._lock:
            count = self._counts.get(key)
        if count is not None:
            return count
        if fmt not in FORMATS:
            raise DataError(f"shard {shard_path}: unknown format {fmt!r}; supported: {FORMATS}")
        count = self._entries.get(key).rows
        self.remember_rows(shard_path, fmt, identity, count)
        return count

    def columns(self, shard_path: str, fmt: str, identity: str) -> Columns | None:
        """A Parquet shard version's top-level columns, from its index entry (built when
        missing); None for other formats."""
        return self._entries.get((shard_path, fmt, identity)).columns if fmt == PARQUET else None

    def ensure_entry(
        self, shard_path: str, fmt: str, identity: str
    ) -> tuple[int, Columns | None, bool]:
        """The row count and columns of a shard version from its index entry, and whether
        the entry had to be built (and saved) now. Keeps nothing of the shard: for building
        the index ahead of time (``zephon index``)."""
        entry = self.index.load(shard_path, fmt, identity)
        if entry is not None:
            return entry.rows, entry.columns, False
        if fmt in (JSONL_GZ, JSONL_ZST):
            saved: list[IndexEntry] = []
            self._decompress_and_index((shard_path, fmt, identity), saved, keep=False)
            return saved[0].rows, None, True
        if fmt not in FORMATS:
            raise DataError(f"shard {shard_path}: unknown format {fmt!r}; supported: {FORMATS}")
        entry = self._build_entry(shard_path, fmt, identity)
        self._footers.forget(shard_path)
        return entry.rows, entry.columns, True

    def remember_rows(self, shard_path: str, fmt: str, identity: str, rows: int) -> None:
        """Record the row count of version ``identity`` of a shard, known from the index
        (a dataset catalog), so :meth:`num_rows` answers without opening anything."""
        with self._lock:
            self._counts[(shard_path, fmt, identity)] = rows

    def read_rows(
        self,
        shard: ShardInfo,
        rows: Sequence[int],
        text_field: str,
        max_document_bytes: int | None = None,
        *,
        records: bool = False,
    ) -> list[Row]:
        """Rows ``rows`` of ``shard`` in the requested order (duplicates allowed).

        JSONL formats return raw line bytes and ignore ``text_field``; Parquet returns the
        values of column ``text_field`` (with ``records``, a list or struct column's too, as
        Python lists and dicts). A row longer than ``max_document_bytes`` is returned
        as :class:`Oversized` (a plain JSONL one is never read), a row of a Parquet row group
        that cannot be read as :class:`~.parquet_rows.Unreadable`. Raises :class:`DataError`
        for unreadable files, a missing column or out-of-range rows, and
        :class:`~.errors.ShardChanged` when the file is no longer the version ``shard``
        describes (its :attr:`~.datasets.ShardInfo.identity`).
        """
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if shard.format == JSONL:
            return self._read_plain(shard, idx, max_document_bytes)
        if shard.format in (JSONL_GZ, JSONL_ZST):
            framed = self._read_frames(shard, idx, max_document_bytes)
            if framed is not None:
                return framed
            data, starts = self._compressed(shard.path, shard.format, shard.identity)
            _check_rows(shard.path, idx, len(starts) - 1)
            if isinstance(data, (Spilled, Unspilled)):
                return self._read_spilled(shard, idx, max_document_bytes)
            lo = starts[idx].tolist()
            hi = (starts[idx + 1] - 1).tolist()
            limit = max_document_bytes
            with memoryview(data) as view:
                return [
                    view[a:b].tobytes() if limit is None or b - a <= limit else Oversized(b - a)
                    for a, b in zip(lo, hi)
                ]
        if shard.format == PARQUET:
            return self._read_parquet(
                shard.path, idx, (text_field, records), shard.identity, max_document_bytes
            )
        raise DataError(
            f"shard {shard.path}: unknown format {shard.format!r}; supported: {FORMATS}"
        )

    def stats(self) -> dict[str, int]:
        """A snapshot of the cache counters."""
        with self._lock:
            return {
                "hits": self._lru.hits,
                "misses": self.misses,
                "evictions": self._lru.evictions,
                "index_builds": self.index_builds,
                "decompressions": self.decompressions,
                "frame_reads": self.frame_reads,
                "footer_reads": self.footer_reads,
                "row_group_reads": self.row_group_reads,
                "bytes_cached": self._lru.bytes_cached,
                "spills": self.spills,
                "spill_hits": self.spill_hits,
                "entries": len(self._lru),
                "line_indexes": len(self._entries),
                **self.index.stats(),
            }

    def clear(self) -> None:
        """Drop every cached index, shard and row group (counters are kept; the files of an
        index directory stay)."""
        self._lru.clear()
        with self._lock:
            self._counts.clear()
            self._footers.clear()
        self._entries.clear()
        self.index.store.forget_memory()

    # ------------------------------------------------------------------ LRU

    @property
    def bytes_cached(self) -> int:
        """Bytes the cached shards, frames, blocks and row groups take now."""
        return self._lru.bytes_cached

    @property
    def hits(self) -> int:
        return self._lru.hits

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    def _stripe(self, key: Hashable) -> threading.Lock:
        return self._stripes[hash(key) % _LOCK_STRIPES]

    # ------------------------------------------------------------------ index entries

    def _build_entry(self, path: str, fmt: str, identity: str) -> IndexEntry:
        """Index the shard itself (a verified full pass) and save the entry."""
        if fmt == JSONL:
            starts = _checked_load(path, identity, lambda: _index_version(path, identity))
            with self._lock:
                self.index_builds += 1
                self.misses += 1
            logger.debug("indexed %s: %d rows", path, len(starts) - 1)
            return self.index.save(path, fmt, identity, len(starts) - 1, {"starts": starts})
        if fmt == PARQUET:
            _, bounds, schema = self._parquet_meta(path, identity)
            arrays, columns = {"row_groups": bounds}, schema_columns(schema)
            return self.index.save(path, fmt, identity, int(bounds[-1]), arrays, columns)
        return self._compressed_entry(path, fmt, identity)

    # ------------------------------------------------------------------ JSONL

    def _plain_index(self, path: str, identity: str) -> np.ndarray:
        """The line index of version ``identity`` of ``path`` (built once per version)."""
        return self._entries.get((path, JSONL, identity)).arrays["starts"]

    def _read_plain(self, shard: ShardInfo, idx: np.ndarray, limit: int | None) -> list[Row]:
        path = shard.path
        starts = self._plain_index(path, shard.identity)
        _check_rows(path, idx, len(starts) - 1)
        out: list[Row] = [None] * len(idx)
        if not len(idx):
            return out
        lo = starts[idx]
        hi = starts[idx + 1] - 1
        order = np.argsort(lo, kind="stable")
        if limit is not None:
            order = self._mark_oversized(hi - lo, limit, order, out)
        if not len(order):
            return out
        order = order.tolist()
        lo_l = lo.tolist()
        hi_l = hi.tolist()
        if is_url(path):
            spans = [(lo_l[i], hi_l[i]) for i in order]
            rows = shard_io.read_spans(
                path,
                shard.identity,
                spans,
                self._lru.get,
                self._lru.put,
                lambda load: _checked_load(path, shard.identity, load),
            )
            for i, row in zip(order, rows):
                out[i] = row
            return out
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise unreadable(path, exc) from exc
        try:
            found = _regular_identity(path, os.fstat(fd))  # one fstat per read call
            if found != shard.identity:
                raise _changed(path, shard.identity, found)
            pread_rows(fd, path, order, lo_l, hi_l, out)
        except OSError as exc:
            raise unreadable(path, exc) from exc
        finally:
            os.close(fd)
        return out

    @staticmethod
    def _mark_oversized(
        sizes: np.ndarray, limit: int, order: np.ndarray, out: list[Row]
    ) -> np.ndarray:
        """Put :class:`Oversized` markers in ``out`` for rows over ``limit``; the read order
        of the others."""
        over = sizes > limit
        if not over.any():
            return order
        for i in np.flatnonzero(over).tolist():
            out[i] = Oversized(int(sizes[i]))
        return order[~over[order]]

    def _cached(self, key: Hashable, load: Callable[[], tuple[Any, int]]) -> Any:
        """``key`` from the LRU, or ``load()`` -> (value, nbytes) once under the key's lock."""
        hit = self._lru.get(key)
        if hit is not None:
            return hit
        with self._stripe(key):
            hit = self._lru.get(key)
            if hit is not None:
                return hit
            value, nbytes = load()
            self._lru.put(key, value, nbytes)
            return value

    def _compressed(
        self, path: str, fmt: str, identity: str, saved: list[IndexEntry] | None = None
    ) -> tuple[Any, np.ndarray]:
        """The whole content of a compressed shard and its line starts (LRU). Decompressing
        it also saves its index entry when the index has none (appended to ``saved``)."""
        key = (path, fmt, identity)
        value = self._cached(key, lambda: self._decompress_and_index(key, saved))
        return value  # type: ignore[no-any-return]

    def _decompress_and_index(
        self, key: tuple[str, str, str], saved: list[IndexEntry] | None, keep: bool = True
    ) -> tuple[tuple[Any, np.ndarray], int]:
        """Decompress (verified) a compressed shard: ((content, line starts), nbytes); saves
        its index entry (with the zstd frame table) when the index has none. A content over
        the spill threshold is a :class:`~.spill.Spilled` file (reused when one is there
        already) or, when it cannot be kept (or ``keep`` is False: counting only),
        :class:`~.spill.Unspilled`."""
        reused = self._from_spill(key, saved) if keep else None
        if reused is not None:
            return reused
        path, fmt, identity = key
        frames: list[Frame] = []
        sinks: list[SpillSink] = []

        by_frame = frames if fmt == JSONL_ZST and not is_url(path) else None

        def sink(expected: int) -> SpillSink:
            sinks.append(self.spill.sink(key, self.spill_threshold, expected, keep, by_frame))
            return sinks[-1]

        def load() -> Any:
            return _decompress_version(path, fmt, identity, frames, sink, self.spill_threshold)

        try:
            data = _checked_load(path, identity, load)
        except BaseException:
            for each in sinks:
                each.discard()
            raise
        spilled = isinstance(data, (Spilled, Unspilled))
        starts = data.starts if spilled else line_starts(data)
        size = data.size if spilled else len(data)
        with self._lock:
            self.misses += 1
            self.decompressions += 1
            self.index_builds += 1
            self.spills += isinstance(data, Spilled)
            self._counts[key] = len(starts) - 1
        logger.debug("decompressed %s: %d bytes, %d rows", path, size, len(starts) - 1)
        framed = len(frames) > 1 and not is_url(path)  # read frame by frame: needs no spill
        if isinstance(data, Unspilled) and keep and not framed:
            logger.warning("%s", spill_error(path, fmt, data.reason))
        entry = self._entries.peek(key)
        if entry is None:
            arrays = {"starts": starts}
            if fmt == JSONL_ZST:
                arrays["frames"] = np.array(frames, dtype=np.int64).reshape(-1, 4)
            entry = self.index.save(path, fmt, identity, len(starts) - 1, arrays)
        if saved is not None:
            saved.append(entry)
        return (data, starts), (0 if spilled else size) + starts.nbytes

    def _from_spill(
        self, key: tuple[str, str, str], saved: list[IndexEntry] | None
    ) -> tuple[tuple[Any, np.ndarray], int] | None:
        """The spill file of ``key`` with the starts of its index entry, if both are there
        (and the shard still has the identity); None otherwise."""
        entry = self._entries.peek(key)
        if entry is None or int(entry.arrays["starts"][-1]) <= self.spill_threshold:
            return None
        path, _, identity = key
        starts = entry.arrays["starts"]
        found = _checked_load(path, identity, lambda: self.spill.find(key, int(starts[-1])))
        if found is None:
            return None
        with self._lock:
            self.spill_hits += 1
            self._counts[key] = len(starts) - 1
        if saved is not None:
            saved.append(entry)
        return (Spilled(found.path, found.size, starts), starts), starts.nbytes

    def _read_spilled(self, shard: ShardInfo, idx: np.ndarray, limit: int | None) -> list[Row]:
        """Rows of a compressed shard from its spill file (spilled again once if another
        process removed the file meanwhile); :class:`~.spill.SpillError` when its content
        could not be spilled."""
        key = (shard.path, shard.format, shard.identity)
        for attempt in (0, 1):
            data, starts = self._compressed(*key)
            if isinstance(data, Unspilled):
                raise spill_error(shard.path, shard.format, data.reason)
            try:
                fd = os.open(data.path, os.O_RDONLY)
            except FileNotFoundError:
                self._lru.drop(key)  # removed for room: spill it again
                if attempt:
                    raise
                continue
            try:
                self.spill.used(data.path)
                return self._rows_at(fd, data.path, starts, idx, limit)
            except ShardChanged:  # the spill file is damaged: it is this cache's, not data
                self._drop_damaged_spill(key, data.path)
                if attempt:
                    raise DataError(
                        f"spill file {data.path} of {shard.path} was damaged again once "
                        f"decompressed anew: check the disk under {self.spill.root}"
                    ) from None
            except OSError as exc:
                problem = f"cannot read spill file {data.path} of {shard.path}: {exc}"
                raise DataError(problem) from exc
            finally:
                os.close(fd)
        raise AssertionError("unreachable")

    def _drop_damaged_spill(self, key: tuple[str, str, str], path: str) -> None:
        """Remove a spill file whose rows are not lines of it (damaged on disk: a crash
        before its pages were written, a disk error), so the shard is decompressed again."""
        logger.warning(
            "spill file %s of %s is damaged (a row indexed in it is not a line of it); removing "
            "it and decompressing the shard again",
            path,
            key[0],
        )
        with contextlib.suppress(OSError):
            os.unlink(path)
        self._lru.drop(key)

    def _rows_at(
        self, fd: int, path: str, starts: np.ndarray, idx: np.ndarray, limit: int | None
    ) -> list[Row]:
        """Rows ``idx`` of the JSONL content in ``fd`` with line ``starts``."""
        out: list[Row] = [None] * len(idx)
        lo = starts[idx]
        hi = starts[idx + 1] - 1
        order = np.argsort(lo, kind="stable")
        if limit is not None:
            order = self._mark_oversized(hi - lo, limit, order, out)
        if len(order):
            pread_rows(fd, path, order.tolist(), lo.tolist(), hi.tolist(), out)
        return out

    def _compressed_entry(self, path: str, fmt: str, identity: str) -> IndexEntry:
        """Decompress (verified) and index a compressed shard; the content stays in the LRU."""
        saved: list[IndexEntry] = []
        _, starts = self._compressed(path, fmt, identity, saved)
        entry = saved[0] if saved else self.index.load(path, fmt, identity)
        # Content cached but its entry since deleted or damaged: from the content (no frame
        # table, so the shard is read whole).
        return entry or self.index.save(path, fmt, identity, len(starts) - 1, {"starts": starts})

    def _read_frames(
        self, shard: ShardInfo, idx: np.ndarray, limit: int | None
    ) -> list[Row] | None:
        """Rows of a multi-frame zstd shard, read frame by frame; None to read it whole (it
        is decompressed in the LRU already, has one frame, or is not indexed yet)."""
        key = (shard.path, shard.format, shard.identity)
        cached = self._lru.look(key)
        in_memory = cached is not None and not isinstance(cached[0], (Spilled, Unspilled))
        if shard.format != JSONL_ZST or is_url(shard.path) or in_memory:
            return None  # an object is downloaded whole (one verified pass, few requests)
        entry = self._entries.peek(key)
        frames = entry.arrays.get("frames") if entry is not None else None
        if entry is None or frames is None or len(frames) < 2:
            return None
        starts = entry.arrays["starts"]
        _check_rows(shard.path, idx, len(starts) - 1)

        got: dict[int, bytes] = {}  # this call's frames: one LRU lookup each

        def frame(k: int) -> bytes:
            if k in got:
                return got[k]

            def load() -> tuple[bytes, int]:
                path = shard.path
                content = _checked_load(path, shard.identity, lambda: read_frame(path, frames, k))
                with self._lock:
                    self.misses += 1
                    self.frame_reads += 1
                return content, len(content)

            got[k] = self._cached((*key, "frame", k), load)
            return got[k]

        rows = frame_rows(shard.path, starts, frames, idx, frame, limit)
        return [Oversized(v) if isinstance(v, int) else v for v in rows]

    # ------------------------------------------------------------------ Parquet

    def _parquet_meta(self, path: str, identity: str) -> tuple[Any, np.ndarray, Any]:
        """(FileMetaData, cumulative row-group bounds, arrow schema) of a Parquet shard."""
        kept = self._footers.get(path, identity)
        if kept is not None:
            return kept  # type: ignore[no-any-return]

        def load() -> tuple[Any, np.ndarray, Any]:
            return read_footer(_parquet_source(path, identity), path)

        meta = _checked_load(path, identity, load)
        with self._lock:
            self.footer_reads += 1
        self._footers.put(path, identity, meta, int(meta[0].serialized_size))
        return meta

    def _read_parquet(
        self,
        path: str,
        idx: np.ndarray,
        field: tuple[str, bool],
        identity: str,
        limit: int | None,
    ) -> list[Row]:
        text_field, records = field
        md, bounds, schema = self._parquet_meta(path, identity)
        _check_field(path, schema, text_field, records)
        _check_rows(path, idx, int(bounds[-1]))
        groups = np.searchsorted(bounds, idx, side="right") - 1
        out: list[Row] = [None] * len(idx)
        idx_l = idx.tolist()
        for rg in np.unique(groups).tolist():
            at = np.flatnonzero(groups == rg).tolist()
            group = self._row_group(path, (md, bounds), rg, text_field, identity, limit)
            if isinstance(group, Unreadable):
                for i in at:
                    out[i] = group
                continue
            values, sizes = group
            base = int(bounds[rg])
            over = limit is not None and int(sizes.max(initial=0)) > limit
            for i in at:
                j = idx_l[i] - base
                out[i] = Oversized(int(sizes[j])) if over and sizes[j] > limit else values[j]
        return out

    def _row_group(
        self,
        path: str,
        meta: tuple[Any, np.ndarray],
        rg: int,
        text_field: str,
        identity: str,
        limit: int | None,
    ) -> tuple[list[Any], np.ndarray] | Unreadable:
        """A row group's values of ``text_field`` (None for nulls and, never converted nor
        cached, for values over ``limit``) and their sizes in bytes (0 for nulls), or the
        marker of its rows when it is damaged (:mod:`.parquet_rows`)."""
        md, bounds = meta

        def read() -> Any:
            source = _parquet_source(path, identity)
            return read_column(source, md, rg, text_field, path, bounds)

        def load() -> tuple[tuple[list[Any], np.ndarray] | Unreadable, int]:
            with self._lock:
                self.misses += 1
                self.row_group_reads += 1
            try:
                column = _checked_load(path, identity, read)
            except DamagedRowGroup as exc:
                found = _identity_now(path)  # a file rewritten while read is other data
                if found != identity:
                    raise _changed(path, identity, found) from exc
                # kept like a good row group: every later read of its rows gets the marker
                # without decoding the damaged pages again
                return exc.marker, _PY_OBJECT_OVERHEAD + len(exc.marker.problem)
            values, sizes, nbytes = column_values(column, limit)
            return (values, sizes), nbytes + _PY_OBJECT_OVERHEAD * len(values) + sizes.nbytes

        key = (path, PARQUET, text_field, rg, identity, limit)
        return self._cached(key, load)  # type: ignore[no-any-return]


_default_cache: ShardCache | None = None
_default_lock = threading.Lock()
_dir_caches: dict[str | None, ShardCache] = {}


def default_cache() -> ShardCache:
    """The process-wide shared :class:`ShardCache` (created on first use; its index lives in
    memory only)."""
    global _default_cache
    with _default_lock:
        if _default_cache is None:
            _default_cache = ShardCache()
        return _default_cache


def cache_for(store: IndexDir | None) -> ShardCache:
    """The process-wide shared :class:`ShardCache` whose index lives in ``store`` (one per
    index directory; :func:`default_cache` for None), so planning and every operator of a
    process share counts, open indexes and cached shards."""
    if store is None:
        return default_cache()
    with _default_lock:
        cache = _dir_caches.get(store.root)
        if cache is None:
            cache = _dir_caches[store.root] = ShardCache(index=ShardIndex(store))
        return cache
