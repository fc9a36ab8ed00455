"""Dataset catalogs: one index file per dataset listing, holding every shard's row count and,
for Parquet shards, the file's top-level columns.

A warm start of a dataset of 10,000 shards must not open 10,000 index entries: it lists and
stats the shards (which it must do anyway to know their identities), then reads *one*
catalog, keyed by a hash of the full listing (every shard's location, identity and format,
in order). Any change to the listing (a shard added, removed, rewritten) is another key, so a
catalog is never used for another set of files; the listing is also stored inside and
compared on read. Entries are then opened only when a shard is first read.

Columns (name and Arrow type, as the shard's entry holds them) are what start-up checks each
Parquet shard's text column with (:mod:`.text_columns`), so a warm start checks every shard
from this one file. A corpus has few distinct schemas: ``schemas`` holds each once and
``schema_of`` the index of each shard's (null for JSONL shards). A catalog of version 1 holds
no columns: it has another name (the version is part of the hashed key) and is never read.

A catalog is derived data like an entry: written after every shard of the listing was
counted through its (verified) entry, sealed with the same checksum trailer
(:func:`.shard_index.seal`), and rebuilt with a warning when it is damaged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .parquet_columns import Columns
from .shard_index import (
    COLUMN_FORMATS,
    CorruptIndexEntry,
    EntryKey,
    ShardIndex,
    decode_columns,
    seal,
    unseal,
)

if TYPE_CHECKING:
    from .index_dir import Buffer
    from .shards import ShardCache

#: 2: catalogs hold the Parquet shards' columns.
CATALOG_VERSION = 2
CATALOG_MAGIC = b"ZPHSCAT\x01"

#: A dataset listing: (location, identity, format) of every shard, in dataset order.
Listing = Sequence[tuple[str, str, str]]


@dataclass(frozen=True)
class Counts:
    """What counting a listing gives: each shard's rows and columns (None but for Parquet),
    and whether they came from the listing's catalog."""

    rows: list[int]
    columns: list[Columns | None]
    from_catalog: bool


def _key(listing: Listing) -> dict[str, object]:
    return {"version": CATALOG_VERSION, "shards": [list(item) for item in listing]}


def catalog_name(listing: Listing) -> str:
    """The catalog's file name in the index directory: a hash of the whole listing."""
    text = json.dumps(_key(listing), separators=(",", ":"))
    return f"catalogs/{hashlib.sha256(text.encode()).hexdigest()[:40]}.zsc"


def encode_catalog(
    listing: Listing, rows: Sequence[int], columns: Sequence[Columns | None]
) -> bytes:
    """The bytes of the catalog of ``listing`` with these row counts and columns."""
    schemas: dict[Columns, int] = {}
    schema_of = [None if c is None else schemas.setdefault(c, len(schemas)) for c in columns]
    doc = {
        "key": _key(listing),
        "rows": [int(r) for r in rows],
        "schemas": [[list(column) for column in schema] for schema in schemas],
        "schema_of": schema_of,
    }
    return seal(CATALOG_MAGIC, json.dumps(doc).encode())


def decode_catalog(buf: Buffer, listing: Listing) -> tuple[list[int], list[Columns | None]]:
    """The row counts and columns in catalog ``buf``, checked against ``listing``; raises
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
    return rows, _columns_of(doc, listing)


def _columns_of(doc: dict[str, Any], listing: Listing) -> list[Columns | None]:
    """Each shard's columns in a catalog document: a shard of a format whose entries hold
    columns must have some (a catalog without them is never trusted), any other none."""
    schemas, schema_of = doc.get("schemas"), doc.get("schema_of")
    if not isinstance(schemas, list) or not isinstance(schema_of, list):
        raise CorruptIndexEntry("index catalog without the shards' columns")
    distinct = [decode_columns(schema, "index catalog") for schema in schemas]
    if len(schema_of) != len(listing) or None in distinct:
        raise CorruptIndexEntry("index catalog with invalid columns")
    out: list[Columns | None] = []
    for (_, _, fmt), at in zip(listing, schema_of):
        wanted = fmt in COLUMN_FORMATS
        if (at is not None) != wanted or (
            wanted and not (isinstance(at, int) and 0 <= at < len(distinct))
        ):
            raise CorruptIndexEntry("index catalog with invalid columns")
        out.append(distinct[at] if wanted else None)
    return out


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


def load_catalog(
    index: ShardIndex, listing: Listing
) -> tuple[list[int], list[Columns | None]] | None:
    """The row counts and columns of ``listing`` from its catalog; None when there is none
    (or it is damaged: logged, and rewritten by the next :func:`save_catalog`)."""
    name = catalog_name(listing)
    buf = index.store.open_mapped(name)
    if buf is None:
        return None
    try:
        found = decode_catalog(buf, listing)
    except CorruptIndexEntry as exc:
        index.discard(name, str(exc))
        return None
    index.bump("catalog_hits")
    index.pin_catalog(name, listing)
    index.store.touch(name)  # recency for the budget's least-recently-used order
    return found


def save_catalog(
    index: ShardIndex, listing: Listing, rows: Sequence[int], columns: Sequence[Columns | None]
) -> None:
    """Write the catalog of ``listing`` (only to a persistent directory: in memory it would
    only duplicate the counts the cache keeps)."""
    if not index.store.persistent:
        return
    name = catalog_name(listing)
    index.store.put_atomic(name, encode_catalog(listing, rows, columns))
    index.bump("catalog_writes")
    index.pin_catalog(name, listing)


def shared_columns(seen: dict[Columns, Columns], columns: Columns | None) -> Columns | None:
    """``columns`` as the equal value already in ``seen`` (added when new): shards of one
    schema then hold one copy, whatever the number of shards."""
    return None if columns is None else seen.setdefault(columns, columns)


def count_shards(cache: ShardCache, listing: Listing) -> Counts:
    """The row count and columns of every shard of ``listing``, and whether they came from
    its catalog.

    A catalog hit reads no shard and no entry (the counts are handed to ``cache`` so later
    ``num_rows`` calls agree); otherwise every shard is counted through ``cache`` (its entry,
    built when missing) and the catalog is written for the next start.
    """
    found = load_catalog(cache.index, listing)
    if found is not None:
        for (location, identity, fmt), n in zip(listing, found[0]):
            cache.remember_rows(location, fmt, identity, n)
        return Counts(*found, from_catalog=True)
    seen: dict[Columns, Columns] = {}
    rows: list[int] = []
    columns: list[Columns | None] = []
    for location, identity, fmt in listing:
        rows.append(cache.num_rows(location, fmt, identity))
        columns.append(shared_columns(seen, cache.columns(location, fmt, identity)))
    save_catalog(cache.index, listing, rows, columns)
    return Counts(rows, columns, from_catalog=False)
