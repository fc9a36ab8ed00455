"""Dataset catalogs: one index file per dataset listing, holding every shard's row count.

A warm start of a dataset of 10,000 shards must not open 10,000 index entries: it lists and
stats the shards (which it must do anyway to know their identities), then reads *one*
catalog, keyed by a hash of the full listing (every shard's location, identity and format,
in order). Any change to the listing (a shard added, removed, rewritten) is another key, so a
catalog is never used for another set of files; the listing is also stored inside and
compared on read. Entries are then opened only when a shard is first read.

A catalog is derived data like an entry: written after every shard of the listing was
counted through its (verified) entry, sealed with the same checksum trailer
(:func:`.shard_index.seal`), and rebuilt with a warning when it is damaged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .shard_index import CorruptIndexEntry, EntryKey, ShardIndex, seal, unseal

if TYPE_CHECKING:
    from .index_dir import Buffer
    from .shards import ShardCache

CATALOG_VERSION = 1
CATALOG_MAGIC = b"ZPHSCAT\x01"

#: A dataset listing: (location, identity, format) of every shard, in dataset order.
Listing = Sequence[tuple[str, str, str]]


def _key(listing: Listing) -> dict[str, object]:
    return {"version": CATALOG_VERSION, "shards": [list(item) for item in listing]}


def catalog_name(listing: Listing) -> str:
    """The catalog's file name in the index directory: a hash of the whole listing."""
    text = json.dumps(_key(listing), separators=(",", ":"))
    return f"catalogs/{hashlib.sha256(text.encode()).hexdigest()[:40]}.zsc"


def encode_catalog(listing: Listing, rows: Sequence[int]) -> bytes:
    """The bytes of the catalog of ``listing`` with these row counts."""
    body = json.dumps({"key": _key(listing), "rows": [int(r) for r in rows]}).encode()
    return seal(CATALOG_MAGIC, body)


def decode_catalog(buf: Buffer, listing: Listing) -> list[int]:
    """The row counts in catalog ``buf``, checked against ``listing``; raises
    :class:`~.shard_index.CorruptIndexEntry`."""
    body = unseal(buf, CATALOG_MAGIC, "index catalog")
    try:
        doc = json.loads(bytes(body[len(CATALOG_MAGIC) :]))
        key, rows = doc["key"], doc["rows"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptIndexEntry(f"unreadable index catalog: {exc}") from exc
    if key != _key(listing):
        raise CorruptIndexEntry("index catalog of another shard listing")
    if not isinstance(rows, list) or len(rows) != len(listing):
        raise CorruptIndexEntry("index catalog with a wrong number of row counts")
    if not all(isinstance(r, int) and r >= 0 for r in rows):
        raise CorruptIndexEntry("index catalog with invalid row counts")
    return rows


def catalog_listing(buf: Buffer) -> Listing:
    """The shard listing catalog ``buf`` was written for (without knowing it beforehand: for
    the budget, which must know which entries a catalog refers to); raises
    :class:`~.shard_index.CorruptIndexEntry` for a damaged catalog or another version."""
    body = unseal(buf, CATALOG_MAGIC, "index catalog")
    try:
        key = json.loads(bytes(body[len(CATALOG_MAGIC) :]))["key"]
        if key["version"] != CATALOG_VERSION:
            raise CorruptIndexEntry(f"index catalog of version {key['version']}")
        return [(str(loc), str(ident), str(fmt)) for loc, ident, fmt in key["shards"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptIndexEntry(f"unreadable index catalog: {exc}") from exc


def entry_names(listing: Listing) -> list[str]:
    """The names of the index entries of every shard of ``listing``."""
    return [EntryKey(loc, ident, fmt).name for loc, ident, fmt in listing]


def load_catalog(index: ShardIndex, listing: Listing) -> list[int] | None:
    """The row counts of ``listing`` from its catalog; None when there is none (or it is
    damaged: logged, and rewritten by the next :func:`save_catalog`)."""
    name = catalog_name(listing)
    buf = index.store.open_mapped(name)
    if buf is None:
        return None
    try:
        rows = decode_catalog(buf, listing)
    except CorruptIndexEntry as exc:
        index.discard(name, str(exc))
        return None
    index.bump("catalog_hits")
    index.pin_catalog(name, listing)
    index.store.touch(name)  # recency for the budget's least-recently-used order
    return rows


def save_catalog(index: ShardIndex, listing: Listing, rows: Sequence[int]) -> None:
    """Write the catalog of ``listing`` (only to a persistent directory: in memory it would
    only duplicate the counts the cache keeps)."""
    if not index.store.persistent:
        return
    name = catalog_name(listing)
    index.store.put_atomic(name, encode_catalog(listing, rows))
    index.bump("catalog_writes")
    index.pin_catalog(name, listing)


def count_shards(cache: ShardCache, listing: Listing) -> tuple[list[int], bool]:
    """The row count of every shard of ``listing`` and whether they came from its catalog.

    A catalog hit reads no shard and no entry (the counts are handed to ``cache`` so later
    ``num_rows`` calls agree); otherwise every shard is counted through ``cache`` (its entry,
    built when missing) and the catalog is written for the next start.
    """
    rows = load_catalog(cache.index, listing)
    if rows is not None:
        for (location, identity, fmt), n in zip(listing, rows):
            cache.remember_rows(location, fmt, identity, n)
        return rows, True
    rows = [cache.num_rows(location, fmt, identity) for location, identity, fmt in listing]
    save_catalog(cache.index, listing, rows)
    return rows, False
