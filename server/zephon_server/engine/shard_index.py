"""The persisted shard index: what start-up and reading need from a shard, computed once.

An *entry* holds, for one version of one shard, its row count and the arrays that make its
rows cheap to find:

* plain JSONL: ``starts``, the ``int64`` line starts :func:`~.shards.index_lines` returns
  (``rows + 1`` values, 8 bytes per row);
* ``.jsonl.gz`` / ``.jsonl.zst``: ``starts`` of the decompressed content, and for zstd
  ``frames``, one row ``(compressed offset, compressed length, decompressed offset,
  decompressed length)`` per frame, so a read can decompress only the frames holding its rows.
  An entry is written only after a decompression that was verified complete
  (:mod:`.decompression`);
* Parquet: ``row_groups``, the cumulative row-group bounds, and in the header ``columns``,
  the file's top-level columns (name and Arrow type as a string), so a start checks each
  shard's text column without reading its footer (:mod:`.text_columns`).

**Keys.** An entry is keyed by the shard's location, its identity (:mod:`.identity`: size and
modification time), its format and its format's version (:func:`entry_version`). The file name
is a hash of that key; the full key is also stored inside and compared on every read, so a
changed shard (a new identity) gets a new entry and is never read through the old one.

**File format** (little-endian): ``MAGIC`` (8 bytes), the header length (u32), a JSON header
(key, rows, Parquet's columns, and each array's name, dtype, shape and offset), zero padding
to 8 bytes, the arrays (8-byte aligned, so they are used in place from a memory map), then a
trailer: the CRC-32 of everything before it (u32) and ``END``. A truncated file, a flipped
byte, another key or another version (or a Parquet entry without columns) is a
:class:`CorruptIndexEntry`; :class:`ShardIndex` logs it as a warning naming the file and the
caller rebuilds the entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ZephonError
from .index_dir import Buffer, IndexDir
from .parquet_columns import Columns

logger = logging.getLogger(__name__)

#: Bumped whenever what an entry holds or how it is computed changes: old entries are then
#: simply not found (another key), never misread. Per format (:data:`FORMAT_VERSIONS`), so
#: that a change to one format's entries does not index every other shard again.
INDEX_VERSION = 1
#: The formats whose entries changed since: Parquet entries hold the file's columns from 2 on.
FORMAT_VERSIONS: dict[str, int] = {"parquet": 2}
#: The formats whose entries must hold ``columns`` (an entry without them is corrupt).
COLUMN_FORMATS = frozenset({"parquet"})
MAGIC = b"ZPHSIDX\x01"
END = b"END\x00"
_LEN = struct.Struct("<I")
_TRAILER = struct.Struct("<I4s")
ENTRY_SUFFIX = ".zsi"
_DTYPES = {"<i8": np.dtype("<i8")}


class CorruptIndexEntry(ZephonError):
    """An index file that is truncated, damaged, of another version or for another key."""


def entry_version(fmt: str) -> int:
    """The version of the entries of shards of format ``fmt``."""
    return FORMAT_VERSIONS.get(fmt, INDEX_VERSION)


@dataclass(frozen=True)
class EntryKey:
    """What an entry is the index of: one version of one shard, in one index format."""

    location: str
    identity: str
    format: str

    @property
    def version(self) -> int:
        """The entry format's version (:func:`entry_version`)."""
        return entry_version(self.format)

    def document(self) -> dict[str, Any]:
        """The key as plain data (stored inside the entry and hashed into its name)."""
        return {
            "location": self.location,
            "identity": self.identity,
            "format": self.format,
            "version": self.version,
        }

    @property
    def name(self) -> str:
        """The entry's file name in the index directory, from a hash of the key."""
        text = json.dumps(self.document(), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()[:40]
        return f"entries/{digest[:2]}/{digest}{ENTRY_SUFFIX}"


@dataclass(frozen=True, eq=False)
class IndexEntry:
    """A decoded entry: its key, row count and arrays (views on the file's mapping), and for
    Parquet the file's top-level columns."""

    key: EntryKey
    rows: int
    arrays: Mapping[str, np.ndarray]
    columns: Columns | None = None


def seal(*parts: bytes) -> bytes:
    """The concatenated ``parts`` with their checksum trailer (CRC-32 and ``END``)."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return b"".join([*parts, _TRAILER.pack(crc, END)])


def unseal(buf: Buffer, magic: bytes, what: str) -> memoryview:
    """The body of a sealed blob after checking its magic and trailer; raises
    :class:`CorruptIndexEntry` saying what is wrong."""
    view = memoryview(buf).cast("B")
    if len(view) < len(magic) + _TRAILER.size:
        raise CorruptIndexEntry(f"truncated {what}: {len(view)} bytes")
    if bytes(view[: len(magic)]) != magic:
        raise CorruptIndexEntry(f"not a Zephon {what} (or another format version)")
    crc, end = _TRAILER.unpack(view[len(view) - _TRAILER.size :])
    body = view[: len(view) - _TRAILER.size]
    if end != END:
        raise CorruptIndexEntry(f"truncated {what}: no end mark (cut short, or bytes appended)")
    if zlib.crc32(body) != crc:
        raise CorruptIndexEntry(f"checksum mismatch in {what} (damaged file)")
    return body


def encode_entry(
    key: EntryKey, rows: int, arrays: Mapping[str, np.ndarray], columns: Columns | None = None
) -> bytes:
    """The bytes of an entry (see the module docstring)."""
    layout: list[list[Any]] = []
    parts: list[bytes] = []
    offset = 0
    for name, array in arrays.items():
        data = np.ascontiguousarray(array, dtype="<i8")
        layout.append([name, "<i8", list(data.shape), offset])
        parts.append(data.tobytes())
        offset += data.nbytes
    doc: dict[str, Any] = {"key": key.document(), "rows": int(rows), "arrays": layout}
    if columns is not None:
        doc["columns"] = [list(column) for column in columns]
    header = json.dumps(doc, sort_keys=True).encode()
    start = len(MAGIC) + _LEN.size + len(header)
    return seal(MAGIC, _LEN.pack(len(header)), header, b"\x00" * (-start % 8), *parts)


def decode_entry(buf: Buffer, key: EntryKey) -> IndexEntry:
    """The entry in ``buf`` (a mapping or bytes), checked against ``key``; the arrays are
    read-only views on ``buf``. Raises :class:`CorruptIndexEntry`."""
    body = unseal(buf, MAGIC, "index entry")
    (size,) = _LEN.unpack(body[len(MAGIC) : len(MAGIC) + _LEN.size])
    start = len(MAGIC) + _LEN.size
    if start + size > len(body):
        raise CorruptIndexEntry("truncated index entry header")
    try:
        header = json.loads(bytes(body[start : start + size]))
        stored = header["key"]
        rows = int(header["rows"])
        layout = header["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptIndexEntry(f"unreadable index entry header: {exc}") from exc
    if stored != key.document():
        raise CorruptIndexEntry(f"index entry of another shard version or format: {stored}")
    columns = decode_columns(header.get("columns"), "index entry")
    if columns is None and key.format in COLUMN_FORMATS:
        raise CorruptIndexEntry("index entry without the file's columns")
    base = start + size + (-(start + size) % 8)
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, rel in layout:
        dt = _DTYPES.get(dtype)
        count = int(np.prod(shape)) if shape else 1
        if dt is None or base + rel + count * 8 > len(body):
            raise CorruptIndexEntry(f"index entry array {name!r} out of bounds or of type {dtype}")
        if count == 0:
            arrays[name] = np.zeros(shape, dtype=dt)
            continue
        arrays[name] = np.frombuffer(body, dtype=dt, count=count, offset=base + rel).reshape(shape)
    return IndexEntry(key, rows, arrays, columns)


def decode_columns(doc: Any, what: str) -> Columns | None:
    """Columns stored as JSON (a list of [name, type] pairs; None: none stored); raises
    :class:`CorruptIndexEntry` for anything else."""
    if doc is None:
        return None
    if isinstance(doc, list) and all(
        isinstance(c, list) and len(c) == 2 and all(isinstance(v, str) for v in c) for c in doc
    ):
        return tuple((name, typ) for name, typ in doc)
    raise CorruptIndexEntry(f"{what} with invalid columns")


#: Damaged blobs remembered so that each is logged once per process (then every one is).
MAX_WARNED = 4096


class ShardIndex:
    """Entries (and dataset catalogs, :mod:`.index_catalog`) of one :class:`IndexDir`.

    :meth:`load` returns a checked entry or None (missing, or corrupt: logged as a warning
    naming the file, so the caller rebuilds it); :meth:`save` writes one atomically and
    returns it as a reader would see it. Counters (``reads``, ``writes``, ``corrupt``,
    ``catalog_hits``) are for tests and logs. Pickles as its directory.
    """

    def __init__(self, store: IndexDir | None = None) -> None:
        self.store = store if store is not None else IndexDir(None)
        self.reads = 0
        self.writes = 0
        self.corrupt = 0
        self.catalog_hits = 0
        self.catalog_writes = 0
        self._pinned_catalogs: dict[str, Any] = {}  # catalog name -> its listing
        self._warned: set[tuple[str, str]] = set()  # (blob, problem) logged (bounded)
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.store,))

    def load(self, location: str, fmt: str, identity: str) -> IndexEntry | None:
        """The entry of this shard version, or None (not indexed yet, or corrupt)."""
        key = EntryKey(location, identity, fmt)
        buf = self.store.open_mapped(key.name)
        if buf is None:
            return None
        try:
            entry = decode_entry(buf, key)
        except CorruptIndexEntry as exc:
            self.discard(key.name, str(exc))
            return None
        with self._lock:
            self.reads += 1
        return entry

    def save(
        self,
        location: str,
        fmt: str,
        identity: str,
        rows: int,
        arrays: Mapping[str, np.ndarray],
        columns: Columns | None = None,
    ) -> IndexEntry:
        """Write the entry of this shard version (``columns``: a Parquet file's); returns it
        decoded from what was written (a memory map of the file when the directory is
        writable)."""
        key = EntryKey(location, identity, fmt)
        data = encode_entry(key, rows, arrays, columns)
        self.store.put_atomic(key.name, data)
        with self._lock:
            self.writes += 1
        buf = self.store.open_mapped(key.name)
        return decode_entry(buf if buf is not None else memoryview(data), key)

    def pin_catalog(self, name: str, listing: Any) -> None:
        """Record that this process uses catalog ``name`` (of ``listing``): the budget never
        removes it nor the entries of its shards (:mod:`.index_budget`)."""
        with self._lock:
            self._pinned_catalogs[name] = listing

    def pinned(self) -> dict[str, Any]:
        """The catalogs (name -> listing) this process has used (read or written)."""
        with self._lock:
            return dict(self._pinned_catalogs)

    def bump(self, counter: str) -> None:
        """Add one to the counter named ``counter`` (e.g. ``catalog_hits``)."""
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def discard(self, name: str, problem: str) -> None:
        """Log a corrupt blob (it is rebuilt and overwritten by the caller)."""
        with self._lock:
            self.corrupt += 1
            if (name, problem) in self._warned:
                return  # the listing, a read and a build each meet the same damaged file
            if len(self._warned) < MAX_WARNED:
                self._warned.add((name, problem))
        logger.warning(
            "shard index file %s is unusable (%s); rebuilding it from the shard",
            self.store.where(name),
            problem,
        )

    def stats(self) -> dict[str, int]:
        """A snapshot of the counters."""
        with self._lock:
            return {
                "index_reads": self.reads,
                "index_writes": self.writes,
                "index_corrupt": self.corrupt,
                "catalog_hits": self.catalog_hits,
                "catalog_writes": self.catalog_writes,
            }
