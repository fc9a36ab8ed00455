"""An object-store bucket as a :class:`~.store.Store`, over a pyarrow.fs file system.

Every call is a counted, retried request (:mod:`.retry`): ``stat`` is a HEAD (pyarrow opens
the object, and its metadata carries the ETag and version), ``list`` one listing (its pages
counted as one request), ``read_range`` one ranged GET, ``read_all`` ranged GETs of
:data:`PART_BYTES` (up to :data:`PARALLEL_PARTS` of them at a time), ``write_atomic`` one PUT
(S3 makes a PUT visible whole or not at all) and ``delete`` one DELETE.

pyarrow opens an object with a HEAD (for its size) before any ranged read; the open handle
of each key is kept (a bounded LRU) and every ``stat`` refreshes it, so a ranged read is a
single GET. The handle clips reads to the size its HEAD saw: a read that comes back short
raises (and is retried); whoever asked can then ``stat`` to tell a changed object apart.
"""

from __future__ import annotations

import datetime
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .options import StorageOptions
from .retry import Requests, RetryPolicy, StorageRequestError
from .s3 import make_filesystem
from .store import ObjectInfo

#: Bytes per ranged GET of a whole-object read.
PART_BYTES = 8 << 20
#: Ranged GETs of one whole-object read in flight at a time (within ``max_concurrency``).
PARALLEL_PARTS = 4
_MAX_HANDLES = 1024


class ArrowStore:
    """One bucket of a pyarrow.fs file system (see the module docstring)."""

    def __init__(self, scheme: str, bucket: str, options: StorageOptions) -> None:
        self.scheme = scheme
        self.bucket = bucket
        self.options = options
        self._fs = make_filesystem(scheme, bucket, options)
        self.requests = Requests(
            RetryPolicy(options.retry_attempts, options.retry_base_s, options.retry_cap_s),
            options.max_concurrency,
        )
        self._handles: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        from .store import bucket_store

        return (bucket_store, (self.scheme, self.bucket, self.options))

    def __repr__(self) -> str:
        return f"ArrowStore({self.scheme}://{self.bucket}, {self.options!r})"

    # ------------------------------------------------------------------ Store API

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def stat(self, key: str) -> ObjectInfo:
        """HEAD ``key``; :class:`StorageRequestError` with outcome ``not_found`` if absent."""

        def attempt() -> ObjectInfo:
            handle = self._fs.open_input_file(self._path(key))
            info = _object_info(key, handle.size(), handle.metadata())
            self._keep(key, handle)
            return info

        return self.requests.call("head", self.url(key), attempt)

    def list(self, prefix: str, recursive: bool = True) -> list[ObjectInfo]:
        import pyarrow.fs as pafs

        base = self._path(prefix).rstrip("/")
        selector = pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
        infos = self.requests.call(
            "list", self.url(prefix), lambda: self._fs.get_file_info(selector)
        )
        skip = len(self._path(""))
        out = [
            ObjectInfo(i.path[skip:], int(i.size), int(i.mtime_ns or 0))
            for i in infos
            if i.type == pafs.FileType.File
        ]
        return sorted(out, key=lambda info: info.key)

    def bucket_exists(self) -> bool:
        """Whether the bucket exists (one HEAD of the bucket)."""
        import pyarrow.fs as pafs

        info = self.requests.call(
            "head", f"{self.scheme}://{self.bucket}", lambda: self._fs.get_file_info(self.bucket)
        )
        return bool(info.type != pafs.FileType.NotFound)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""

        def attempt() -> bytes:
            data = self._handle(key).read_at(length, start)
            if len(data) != length:
                self._forget(key)
                raise OSError(f"short read: {len(data)} of {length} bytes at offset {start}")
            return bytes(data)

        return self.requests.call("get", self.url(key), attempt, len)

    def read_all(self, key: str, size: int | None = None) -> bytearray:
        """The whole object in ranged GETs of :data:`PART_BYTES`, several at a time."""
        if size is None:
            size = self.stat(key).size
        out = bytearray(size)
        parts = [(start, min(PART_BYTES, size - start)) for start in range(0, size, PART_BYTES)]

        def fetch(part: tuple[int, int]) -> None:
            start, length = part
            out[start : start + length] = self.read_range(key, start, length)

        if len(parts) <= 1:
            for part in parts:
                fetch(part)
        else:
            list(self._parts_pool().map(fetch, parts))
        return out

    def write_atomic(self, key: str, data: bytes) -> None:
        def attempt() -> None:
            with self._fs.open_output_stream(self._path(key)) as stream:
                stream.write(data)

        self.requests.call("put", self.url(key), attempt)
        self._forget(key)

    def delete(self, key: str) -> None:
        try:
            self.requests.call(
                "delete", self.url(key), lambda: self._fs.delete_file(self._path(key))
            )
        except StorageRequestError as exc:
            if exc.outcome != "not_found":
                raise
        self._forget(key)

    # ------------------------------------------------------------------ internals

    def _path(self, key: str) -> str:
        if self.scheme == "hdfs":
            return "/" + key
        return f"{self.bucket}/{key}"

    def _handle(self, key: str) -> Any:
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None:
                self._handles.move_to_end(key)
                return handle
        self.stat(key)  # opens (one HEAD) and keeps the handle
        with self._lock:
            handle = self._handles.get(key)
        return handle if handle is not None else self._fs.open_input_file(self._path(key))

    def _keep(self, key: str, handle: Any) -> None:
        with self._lock:
            self._handles[key] = handle
            self._handles.move_to_end(key)
            while len(self._handles) > _MAX_HANDLES:
                self._handles.popitem(last=False)

    def _forget(self, key: str) -> None:
        with self._lock:
            self._handles.pop(key, None)

    def _parts_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                workers = max(1, min(PARALLEL_PARTS, self.options.max_concurrency))
                self._pool = ThreadPoolExecutor(workers, thread_name_prefix="zephon-storage")
            return self._pool


def _object_info(key: str, size: int, metadata: dict[str, Any]) -> ObjectInfo:
    """An :class:`ObjectInfo` from an opened object's size and metadata (ETag, version)."""
    meta = {str(k).lower(): _text(v) for k, v in (metadata or {}).items()}
    etag = meta.get("etag", "").strip().strip('"') or None
    version = meta.get("versionid") or None
    if version == "null":  # S3's version of an object written before versioning was enabled
        version = None
    return ObjectInfo(key, int(size), _mtime_ns(meta.get("last-modified", "")), etag, version)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _mtime_ns(text: str) -> int:
    if not text:
        return 0
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return 0
    return int(when.timestamp()) * 1_000_000_000
