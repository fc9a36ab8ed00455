"""Shard identities: the one value that says a shard file is still the file that was indexed.

A local shard's identity is its size and its modification time in nanoseconds, as one string
(``"size=1234 mtime_ns=1767225600123456789"``). Identities are compared as strings and
nothing else: the pipeline fingerprint covers them, the shard manifest records them, and every
read of a plain JSONL shard (and every load of a compressed or Parquet shard into the cache)
compares the open file's identity with the one its rows were indexed under.

An object-store shard's identity is its size and ETag, plus its version where the bucket keeps
versions (``"size=1234 etag=9b2cf535f27731c974343645a3985328 version=3HL4kqtJlcpXroDTDmJ"``):
the ETag changes whenever the object is written again with other content, the version on
every write. Its modification time is not part of it (S3 keeps whole seconds only).

An in-place rewrite by any normal tool changes the modification time, even when it keeps the
size. What an identity cannot see: a rewrite that also sets the old time back (``touch -r``), or
one within the file system's timestamp granularity of the previous write.
"""

from __future__ import annotations

import datetime
import os

_NS = 1_000_000_000


def local_identity(size: int, mtime_ns: int) -> str:
    """The identity of a local file of ``size`` bytes last modified at ``mtime_ns``."""
    return f"size={size} mtime_ns={mtime_ns}"


def object_identity(size: int, etag: str, version: str | None = None) -> str:
    """The identity of an object of ``size`` bytes with ``etag`` (and ``version``)."""
    text = f"size={size} etag={_token(etag)}"
    return f"{text} version={_token(version)}" if version else text


def _token(value: str) -> str:
    """``value`` without quotes or whitespace (identities split on whitespace)."""
    return "".join(value.strip().strip('"').split()) or "-"


def stat_identity(st: os.stat_result) -> str:
    """The identity of the file ``st`` describes (from ``os.stat`` or ``os.fstat``)."""
    return local_identity(st.st_size, st.st_mtime_ns)


def identity_parts(identity: str) -> dict[str, str]:
    """The ``key=value`` parts of an identity string (``{}`` parts for a malformed one)."""
    parts: dict[str, str] = {}
    for item in identity.split():
        key, sep, value = item.partition("=")
        if sep:
            parts[key] = value
    return parts


def format_ns(ns: int) -> str:
    """A nanosecond POSIX time as UTC ISO 8601, nanoseconds kept (``...T12:00:00.000000001Z``)."""
    seconds, frac = divmod(ns, _NS)
    when = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{frac:09d}Z"


def describe_change(old: str, new: str) -> str:
    """What differs between two identities, for messages.

    ``"modified time 2026-01-01T00:00:00.000000000Z -> 2026-01-02T...Z, size 100 bytes
    unchanged"``; a changed size reads ``size 100 -> 120 bytes``; an object store's
    ``"ETag 9b2c... -> 77f1..., size 100 bytes unchanged"``.
    """
    a, b = identity_parts(old), identity_parts(new)
    if ("etag" in a) != ("etag" in b):
        return _moved(a, b)
    changed: list[str] = []
    same: list[str] = []
    for key in sorted(set(a) | set(b), key=_key_order):
        x, y = a.get(key, "-"), b.get(key, "-")
        if x != y:
            changed.append(f"{_label(key)} {_show(key, x)} -> {_show(key, y)}{_unit(key)}")
        else:
            same.append(f"{_label(key)} {_show(key, x)}{_unit(key)} unchanged")
    return ", ".join(changed + same) or "no difference"


def _moved(a: dict[str, str], b: dict[str, str]) -> str:
    """An object then and a local file now, or the reverse: their identities hold different
    things (an ETag, a modification time), so nothing can tell whether the bytes are the same."""

    def kind(parts: dict[str, str]) -> str:
        return "an object (ETag)" if "etag" in parts else "a local file (modified time)"

    size = a.get("size", "-"), b.get("size", "-")
    sizes = f"size {size[0]} bytes" if size[0] == size[1] else f"size {size[0]} -> {size[1]} bytes"
    return (
        f"{kind(a)} then, {kind(b)} now, {sizes}: a checkpoint cannot move between object "
        "storage and local disk, as shards there are identified differently; resume with the "
        "dataset path it was taken on"
    )


def only_time_changed(old: str, new: str) -> bool:
    """True when ``old`` and ``new`` differ in the modification time alone."""
    a, b = identity_parts(old), identity_parts(new)
    differing = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    return differing == {"mtime_ns"}


def _key_order(key: str) -> tuple[int, str]:
    return ({"mtime_ns": 0, "etag": 0, "version": 1, "size": 2}.get(key, 3), key)


def _label(key: str) -> str:
    return {"mtime_ns": "modified time", "size": "size", "etag": "ETag"}.get(key, key)


def _unit(key: str) -> str:
    return " bytes" if key == "size" else ""


def _show(key: str, value: str) -> str:
    if key == "mtime_ns" and value.lstrip("-").isdigit():
        return format_ns(int(value))
    return value
