"""The Store API the engine reads and writes through, its local implementation, and
:func:`open_store`.

A :class:`Store` is one bucket (or the local file system) addressed by keys: ``stat``,
``list``, ``read_range``, ``read_all``, ``write_atomic`` and ``delete``. The object-store one
(:class:`~.remote.ArrowStore`) retries and counts every request; the local one is a thin
layer over ``os`` whose ``write_atomic`` is the usual temp file + fsync + rename + fsync of
the directory. ``open_store(url, options)`` returns the store and the key within it; stores
are cached per (scheme, bucket, options) and process, and pickle as "open that store again",
so an operator holding one can cross into a spawned worker or a Ray actor.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ConfigError, DataError
from .location import ObjectUrl, is_url
from .options import StorageOptions


@dataclass(frozen=True)
class ObjectInfo:
    """What a ``stat`` or a listing says about one object (or local file).

    ``etag`` and ``version`` are ``None`` where the store has none (local files; a bucket
    without versioning has no ``version``); ``mtime_ns`` is 0 when unknown."""

    key: str
    size: int
    mtime_ns: int
    etag: str | None = None
    version: str | None = None


class Store(Protocol):
    """Keyed access to one bucket or to the local file system (see the module docstring)."""

    def url(self, key: str) -> str:
        """The URL (or path) of ``key``, for messages."""
        ...

    def stat(self, key: str) -> ObjectInfo:
        """Size, time, ETag and version of ``key``; ``FileNotFoundError`` when absent."""
        ...

    def list(self, prefix: str, recursive: bool = True) -> list[ObjectInfo]:
        """Every object below ``prefix`` (a directory-like prefix), sorted by key; ``[]``
        when there is none. A missing bucket raises."""
        ...

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``key`` from ``start`` (a short read raises)."""
        ...

    def read_all(self, key: str, size: int | None = None) -> bytes | bytearray:
        """The whole content of ``key`` (``size`` when known saves a ``stat``)."""
        ...

    def write_atomic(self, key: str, data: bytes) -> None:
        """Write ``key`` so that readers see the old content or all of ``data``."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` (absent is fine)."""
        ...


class LocalStore:
    """The local file system as a :class:`Store`; keys are absolute paths."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (LocalStore, ())

    def url(self, key: str) -> str:
        return key

    def stat(self, key: str) -> ObjectInfo:
        st = os.stat(key)
        return ObjectInfo(key, st.st_size, st.st_mtime_ns)

    def list(self, prefix: str, recursive: bool = True) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        if not os.path.isdir(prefix):
            return out
        for root, dirs, names in os.walk(prefix):
            if not recursive:
                dirs[:] = []
            for name in names:
                path = os.path.join(root, name)
                st = os.stat(path)
                out.append(ObjectInfo(path, st.st_size, st.st_mtime_ns))
        return sorted(out, key=lambda info: info.key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with open(key, "rb") as fh:
            data = os.pread(fh.fileno(), length, start)
        if len(data) != length:
            raise DataError(f"{key}: short read ({len(data)} of {length} bytes at {start})")
        return data

    def read_all(self, key: str, size: int | None = None) -> bytes | bytearray:
        with open(key, "rb") as fh:
            return fh.read()

    def write_atomic(self, key: str, data: bytes) -> None:
        from ..checkpoint import write_atomic  # temp file, fsync, rename, fsync the directory

        write_atomic(key, data)

    def delete(self, key: str) -> None:
        try:
            os.unlink(key)
        except FileNotFoundError:
            pass


_LOCAL = LocalStore()
_stores: dict[tuple[str, str, StorageOptions], Store] = {}
_stores_lock = threading.Lock()


def open_store(
    url: str, storage_options: StorageOptions | Mapping[str, Any] | None = None
) -> tuple[Store, str]:
    """The store holding ``url`` and the key of ``url`` in it.

    A local path gives the local store and the absolute path; ``scheme://bucket/key`` gives
    the (cached) store of that bucket and options, and ``key``. Raises ``ValueError`` for a
    malformed URL and :class:`~..errors.ConfigError` for bad options.
    """
    if not is_url(url):
        return _LOCAL, os.path.abspath(url)
    parsed = ObjectUrl.parse(url)
    return bucket_store(parsed.scheme, parsed.bucket, storage_options), parsed.key


def bucket_store(
    scheme: str, bucket: str, storage_options: StorageOptions | Mapping[str, Any] | None = None
) -> Store:
    """The process's store of ``scheme://bucket`` with these options (created once)."""
    options = StorageOptions.from_mapping(storage_options)
    cache_key = (scheme, bucket, options)
    with _stores_lock:
        store = _stores.get(cache_key)
        if store is None:
            from .remote import ArrowStore

            store = ArrowStore(scheme, bucket, options)
            _stores[cache_key] = store
        return store


# ------------------------------------------------------------------ shards' options

_shard_options: dict[tuple[str, str], StorageOptions] = {}


def configure_bucket(url: str, options: StorageOptions, owner: str) -> None:
    """Record the options shard reads of ``url``'s bucket use in this process.

    Datasets register their bucket when they are resolved (and again in each worker process,
    from the pickled datasets). One bucket has one set of options per process: two datasets
    that read one bucket with different options raise :class:`~..errors.ConfigError`
    naming ``owner``.
    """
    parsed = ObjectUrl.parse(url)
    key = (parsed.scheme, parsed.bucket)
    with _stores_lock:
        known = _shard_options.get(key)
        if known is not None and known != options:
            raise ConfigError(
                f"{owner}: bucket {parsed.root} is read by another dataset with other "
                f"storage_options ({known!r} there, {options!r} here); give every dataset of "
                "one bucket the same storage_options"
            )
        _shard_options[key] = options


def shard_store(url: str) -> tuple[Store, str]:
    """The store and key a shard URL is read through (its bucket's configured options, or
    the defaults: the standard AWS configuration)."""
    parsed = ObjectUrl.parse(url)
    with _stores_lock:
        options = _shard_options.get((parsed.scheme, parsed.bucket))
    return bucket_store(parsed.scheme, parsed.bucket, options), parsed.key
