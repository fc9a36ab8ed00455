"""Object-store locations: parsing ``scheme://bucket/key`` URLs and matching key globs.

A dataset path is an object-store URL when it starts with ``<scheme>://`` for a scheme in
:data:`SCHEMES`. Three forms, as for local paths:

* ``s3://bucket/prefix/`` (or a prefix without the slash that is not an object): every object
  below it, recursively, whose name has a supported extension; keys with a hidden part
  (``.name``) are skipped like the local directory walk skips hidden files and directories;
* ``s3://bucket/key.jsonl.zst``: that one object;
* a glob, ``s3://bucket/cc/**/*.parquet``: the semantics of the local ``glob`` with
  ``recursive=True``: ``*``, ``?`` and ``[...]`` match within one path part, ``**`` as a
  whole part matches any number of parts (zero included), and a wildcard never matches a
  part starting with ``.`` unless the pattern part starts with ``.`` too.

Keys are listed in sorted order (the byte order of the key strings), as local paths are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: URL schemes read through pyarrow.fs. ``s3`` is tested; the others may work.
SCHEMES: tuple[str, ...] = ("s3", "gs", "gcs", "hdfs")
GLOB_CHARS = frozenset("*?[")


_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
#: What to say of a scheme that is not read (a hint after the refusal).
_INSTEAD = {
    "s3a": "write s3:// instead (s3a:// and s3n:// are Hadoop's names for it)",
    "s3n": "write s3:// instead (s3a:// and s3n:// are Hadoop's names for it)",
    "file": "give the local path itself, without file://",
    "http": "download the files first",
    "https": "download the files first",
}


def unsupported_scheme(path: str) -> str | None:
    """Why ``path``, a URL of a scheme that is not read, cannot be a dataset path (None for
    a supported URL or a local path)."""
    found = _URL.match(path)
    if found is None or found.group(1).lower() in SCHEMES:
        return None
    scheme = found.group(1).lower()
    instead = _INSTEAD.get(scheme, "copy the data to S3-compatible storage or a local disk")
    return (
        f"the URL scheme {scheme}:// is not supported (object storage is read through s3://, "
        f"tested, and gs:// and hdfs://, untested); {instead}"
    )


def is_url(path: str) -> bool:
    """Whether ``path`` is an object-store URL (``s3://...``) rather than a local path."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


@dataclass(frozen=True)
class ObjectUrl:
    """A parsed URL: scheme, bucket and key (the key may be empty or a prefix)."""

    scheme: str
    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str) -> ObjectUrl:
        """Split ``scheme://bucket/key``; ``ValueError`` naming the URL when malformed."""
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in SCHEMES:
            raise ValueError(
                f"{url!r} is not an object-store URL (expected {', '.join(SCHEMES)}://bucket/key)"
            )
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ValueError(f"{url!r} has no bucket (expected {scheme}://bucket/key)")
        return cls(scheme.lower(), bucket, key)

    @property
    def root(self) -> str:
        """``scheme://bucket``."""
        return f"{self.scheme}://{self.bucket}"

    def with_key(self, key: str) -> str:
        """The URL of ``key`` in the same bucket."""
        return f"{self.root}/{key}"

    def __str__(self) -> str:
        return self.with_key(self.key)


def has_glob(key: str) -> bool:
    """Whether a key holds glob characters."""
    return any(c in GLOB_CHARS for c in key)


def glob_base(pattern: str) -> str:
    """The longest prefix of ``pattern``'s parts without glob characters, ending with ``/``
    (``""`` when the first part is a pattern): where a listing for the pattern starts."""
    parts = pattern.split("/")
    fixed: list[str] = []
    for part in parts[:-1]:
        if has_glob(part):
            break
        fixed.append(part)
    return "".join(p + "/" for p in fixed)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex matching exactly the keys the glob ``pattern`` selects (module docstring)."""
    out: list[str] = []
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            # any number of non-hidden parts; as the last part, also the objects in them
            out.append(r"(?:[^./][^/]*/)*(?:[^./][^/]*)?" if last else r"(?:[^./][^/]*/)*")
            continue
        piece = _part_regex(part)
        if has_glob(part) and not part.startswith("."):
            piece = r"(?!\.)" + piece
        out.append(piece + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def _part_regex(part: str) -> str:
    """One path part of a glob as a regex that never crosses a ``/``."""
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1 if i < len(part) and part[i] in "!]" else i
            j = part.find("]", j + (1 if j < len(part) and part[j] == "]" else 0))
            if j < 0:
                out.append(r"\[")
                continue
            body = part[i:j]
            i = j + 1
            negate = body.startswith("!")
            body = body[1:] if negate else body
            body = body.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
            out.append(f"[{'^/' if negate else ''}{body}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def hidden(relative_key: str) -> bool:
    """Whether any part of a key (relative to the listed prefix) starts with ``.``."""
    return any(part.startswith(".") for part in relative_key.split("/") if part)
