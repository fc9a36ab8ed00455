"""Where shards live: local paths and object stores behind one small Store API.

A dataset path is a local path or an object-store URL (``s3://bucket/prefix/``, one object,
or a glob; :mod:`.location`). Object stores are reached through pyarrow.fs (:mod:`.s3`,
:mod:`.remote`), configured the standard AWS way plus per-dataset ``storage_options``
(:mod:`.options`). Every request is bounded (a semaphore per store and process), retried with
exponential backoff and full jitter (:mod:`.retry`) and counted (:mod:`.metrics`).

The engine uses: :func:`~.store.open_store` (any URL or path -> a :class:`~.store.Store` and
a key), :func:`~.listing.list_object_shards` (dataset resolution), and :mod:`.shard_io`
(what the shard cache reads object-store shards with). Invariants: the bytes read are the
bytes of the object version the shard was resolved with (identities are checked around
every load), and every failure names the URL.
"""

from __future__ import annotations

from .location import SCHEMES, ObjectUrl, is_url, unsupported_scheme
from .metrics import storage_stats
from .options import StorageOptions
from .store import LocalStore, ObjectInfo, Store, configure_bucket, open_store, shard_store

__all__ = [
    "SCHEMES",
    "LocalStore",
    "ObjectInfo",
    "ObjectUrl",
    "StorageOptions",
    "Store",
    "configure_bucket",
    "is_url",
    "open_store",
    "shard_store",
    "storage_stats",
    "unsupported_scheme",
]
