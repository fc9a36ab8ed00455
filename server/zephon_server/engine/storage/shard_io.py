"""Reading object-store shards for the shard cache: identities, line indexes, whole objects,
Parquet files and plain JSONL rows.

:class:`~..shards.ShardCache` keeps its caches and checks and calls these where it would
touch a local file; each read goes through the shard's bucket store (:func:`.store.shard_store`),
so it is retried, bounded and counted. What each read costs:

* identity: one HEAD (size, ETag, version);
* a plain JSONL line index: the object streamed in ranged GETs of :data:`~.remote.PART_BYTES`;
* a compressed shard: downloaded whole in parallel ranged GETs, then decompressed and verified
  from memory (:func:`~..decompression.decompress_bytes`); one larger than the shard cache's
  spill threshold is decoded as it arrives instead, in sequential ranged GETs of
  :data:`~.remote.PART_BYTES` (:func:`stream`: one window in memory, never the object);
* Parquet: a file object over ranged reads (:class:`ObjectFile`): every read is at least
  :data:`MIN_READ` bytes (the footer is read with the 1 MiB before it, a column chunk with
  what follows it), so the footer and each row group's column take one or a few GETs;
* plain JSONL rows: the byte ranges of the rows wanted are mapped to :data:`BLOCK` aligned
  blocks kept in the shard cache's LRU; the missing ones are read with one GET per run of
  adjacent blocks (at most :data:`MAX_RUN_BLOCKS` per GET).

The shard cache wraps every load (index, download, footer, row group, block run) in its
identity check: a HEAD before and after that must find the identity the shard was resolved
with, so nothing read from another version of the object is ever cached or returned.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from ..identity import identity_parts, local_identity, object_identity
from ..line_index import newline_starts
from .remote import PART_BYTES
from .retry import StorageRequestError
from .store import ObjectInfo, shard_store

#: Plain JSONL rows are read and cached in blocks of this many bytes.
BLOCK = 1 << 20
#: Blocks per GET at most (adjacent missing blocks are read together).
MAX_RUN_BLOCKS = 16
#: The least a Parquet read fetches.
MIN_READ = 1 << 20


def identity_of(info: ObjectInfo) -> str:
    """The identity of an object (size + ETag + version; size + time where no ETag)."""
    if info.etag:
        return object_identity(info.size, info.etag, info.version)
    return local_identity(info.size, info.mtime_ns)


def identity_now(url: str) -> str:
    """The identity of the object at ``url`` now (one HEAD); :class:`DataError` if absent."""
    store, key = shard_store(url)
    try:
        return identity_of(store.stat(key))
    except StorageRequestError as exc:
        if exc.outcome == "not_found":
            raise DataError(f"cannot read shard {url}: the object does not exist") from exc
        raise


def size_of(identity: str) -> int:
    """The size an identity records."""
    return int(identity_parts(identity)["size"])


def index_lines(url: str, identity: str) -> np.ndarray:
    """The line index of a plain JSONL object (as :func:`..shards.index_lines`), streamed in
    ranged GETs."""
    store, key = shard_store(url)
    size = size_of(identity)
    pieces = [np.zeros(1, dtype=np.int64)]
    last = 10
    for start in range(0, size, PART_BYTES):
        data = store.read_range(key, start, min(PART_BYTES, size - start))
        pieces.append(newline_starts(data, start))
        last = data[-1]
    if size and last != 10:
        pieces.append(np.array([size + 1], dtype=np.int64))
    return np.concatenate(pieces)


def read_all(url: str, identity: str) -> bytearray:
    """The whole object (parallel ranged GETs)."""
    store, key = shard_store(url)
    data = store.read_all(key, size_of(identity))
    return data if isinstance(data, bytearray) else bytearray(data)


def stream(url: str, identity: str) -> ObjectFile:
    """A file object over the object that reads it in ranged GETs of
    :data:`~.remote.PART_BYTES` (one window in memory), for decoding a large compressed
    object as it arrives instead of holding it whole."""
    store, key = shard_store(url)
    return ObjectFile(store, key, size_of(identity), window=PART_BYTES)


def parquet_file(url: str, identity: str) -> ObjectFile:
    """A file object over the object, for ``pyarrow.parquet.ParquetFile``."""
    store, key = shard_store(url)
    return ObjectFile(store, key, size_of(identity))


def read_spans(
    url: str,
    identity: str,
    spans: Sequence[tuple[int, int]],
    cache_get: Callable[[Hashable], Any],
    cache_put: Callable[[Hashable, Any, int], None],
    checked: Callable[[Callable[[], dict[int, bytes]]], dict[int, bytes]],
) -> list[bytes]:
    """The bytes ``[a, b)`` of each span, through blocks cached with ``cache_get`` /
    ``cache_put``; missing blocks are read inside ``checked`` (the identity check)."""
    size = size_of(identity)
    needed = sorted({b for a, e in spans if e > a for b in range(a // BLOCK, (e - 1) // BLOCK + 1)})
    blocks: dict[int, bytes] = {}
    missing: list[int] = []
    for b in needed:
        hit = cache_get(_block_key(url, identity, b))
        if hit is None:
            missing.append(b)
        else:
            blocks[b] = hit
    if missing:
        store, key = shard_store(url)

        def load() -> dict[int, bytes]:
            loaded: dict[int, bytes] = {}
            for first, last in _runs(missing):
                start, end = first * BLOCK, min(size, (last + 1) * BLOCK)
                data = store.read_range(key, start, end - start)
                for b in range(first, last + 1):
                    loaded[b] = data[(b - first) * BLOCK : (b - first + 1) * BLOCK]
            return loaded

        fresh = checked(load)
        for b, data in fresh.items():
            cache_put(_block_key(url, identity, b), data, len(data))
        blocks.update(fresh)
    return [_assemble(blocks, a, e) for a, e in spans]


def _block_key(url: str, identity: str, block: int) -> tuple[str, str, str, int]:
    return (url, "block", identity, block)


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    """Sorted block numbers as (first, last) runs of adjacent blocks, each at most
    :data:`MAX_RUN_BLOCKS` long."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1 and b - runs[-1][0] < MAX_RUN_BLOCKS:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    return runs


def _assemble(blocks: dict[int, bytes], a: int, e: int) -> bytes:
    if e <= a:
        return b""
    first, last = a // BLOCK, (e - 1) // BLOCK
    if first == last:
        base = first * BLOCK
        return blocks[first][a - base : e - base]
    parts = [blocks[first][a - first * BLOCK :]]
    parts.extend(blocks[b] for b in range(first + 1, last))
    parts.append(blocks[last][: e - last * BLOCK])
    return b"".join(parts)


class ObjectFile(io.RawIOBase):
    """A read-only, seekable file over an object: every read fetches at least ``window``
    (default :data:`MIN_READ`) bytes around it (one ranged GET) and serves later reads in
    that window from memory."""

    def __init__(self, store: Any, key: str, size: int, window: int = MIN_READ) -> None:
        super().__init__()
        self._min = window
        self._store = store
        self._key = key
        self._size = size
        self._pos = 0
        self._window = b""
        self._window_start = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def size(self) -> int:
        """The object's size."""
        return self._size

    def read(self, n: int | None = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        w0, w1 = self._window_start, self._window_start + len(self._window)
        if not (w0 <= self._pos and end <= w1):
            self._fetch(self._pos, end)
            w0 = self._window_start
        out = self._window[self._pos - w0 : end - w0]
        self._pos = end
        return out

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def _fetch(self, start: int, end: int) -> None:
        length = max(end - start, self._min)
        if start + length > self._size:  # near the end (the footer): read the bytes before
            start = max(0, min(start, self._size - length))
        stop = min(self._size, max(end, start + length))
        self._window = self._store.read_range(self._key, start, stop - start)
        self._window_start = start
