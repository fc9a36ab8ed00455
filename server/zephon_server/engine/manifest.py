"""Shard manifests: the shard files (and their versions) a pipeline fingerprint stands for.

A checkpoint carries the pipeline fingerprint and short per-component hashes, so a resume onto
changed data is refused and the differing component (``shards:<dataset>``) names the dataset.
Naming the *file* and the change needs the shard list the checkpoint was taken on, which a
checkpoint must not carry (corpora have thousands of shards; checkpoints stay a few hundred
bytes per lane). So a checkpoint saved to a directory gets a manifest next to it, once per
fingerprint and content-addressed by it::

    <directory>/ckpt-00000003.zck
    <directory>/manifests/<fingerprint>.json   # every dataset's shards: path, rows, identity

A refused resume looks for the manifest of the checkpoint's fingerprint (next to the file it
was read from, and in the server's state directory) and diffs it against the shards on disk:
which shard was modified (size, modification time, rows), added or removed. Without one
(checkpoint bytes from elsewhere) the message names the dataset only.

Manifests only explain: a resume is accepted or refused by the fingerprint alone, so a
missing, stale or damaged manifest can never let changed data through. Deleting them is safe.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .identity import describe_change, only_time_changed
from .storage.location import is_url

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
MANIFEST_DIR = "manifests"
_MAX_LISTED = 6  # changed shards named per message; the rest are counted


@dataclass(frozen=True)
class ShardEntry:
    """One shard in a manifest: its path below the dataset's root, identity and row count."""

    key: str
    identity: str
    rows: int


@dataclass(frozen=True)
class DatasetShards:
    """A dataset's shards: the directory they share (``root``) and each one's entry."""

    root: str
    shards: tuple[ShardEntry, ...]

    def path(self, entry: ShardEntry) -> str:
        """The shard's absolute path (or URL)."""
        if is_url(self.root):
            return f"{self.root}/{entry.key}"
        return os.path.join(self.root, entry.key)

    @classmethod
    def of(cls, paths_identities_rows: Sequence[tuple[str, str, int]]) -> DatasetShards:
        """From (absolute path, identity, rows) per shard; keys are relative to the common
        directory, so a corpus copied or moved elsewhere still matches shard by shard."""
        paths = [p for p, _, _ in paths_identities_rows]
        if paths and is_url(paths[0]):
            return cls._of_urls(paths_identities_rows)
        root = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ""
        return cls(
            root,
            tuple(
                ShardEntry(os.path.relpath(p, root), ident, rows)
                for p, ident, rows in paths_identities_rows
            ),
        )

    @classmethod
    def _of_urls(cls, paths_identities_rows: Sequence[tuple[str, str, int]]) -> DatasetShards:
        """:meth:`of` for object-store URLs (``scheme://`` kept; keys below the common
        prefix of the objects' "directories")."""
        dirs = [p.rsplit("/", 1)[0].split("/") for p, _, _ in paths_identities_rows]
        common = dirs[0]
        for parts in dirs[1:]:
            n = 0
            while n < min(len(common), len(parts)) and common[n] == parts[n]:
                n += 1
            common = common[:n]
        root = "/".join(common)
        return cls(
            root,
            tuple(
                ShardEntry(p[len(root) + 1 :], ident, rows)
                for p, ident, rows in paths_identities_rows
            ),
        )


@dataclass(frozen=True)
class ShardChanges:
    """How one dataset's shards differ from a manifest: one phrase per changed shard."""

    modified: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    times_only: bool  # some shard changed its modification time and nothing else

    def describe(self) -> str:
        """The changes, the first few named and the rest counted."""
        phrases = [*self.modified, *self.added, *self.removed]
        shown = "; ".join(phrases[:_MAX_LISTED])
        if len(phrases) > _MAX_LISTED:
            shown += (
                f"; and {len(phrases) - _MAX_LISTED} more ({len(self.modified)} modified, "
                f"{len(self.added)} added, {len(self.removed)} removed in all)"
            )
        return shown


@dataclass(frozen=True)
class ShardManifest:
    """Every dataset's shards at one pipeline fingerprint (plain data, JSON on disk)."""

    fingerprint: str
    datasets: Mapping[str, DatasetShards]

    @classmethod
    def of(cls, fingerprint: str, dataset_infos: Iterable[Any]) -> ShardManifest:
        """The manifest of resolved datasets (:class:`~.datasets.DatasetInfo`)."""
        return cls(
            fingerprint,
            {
                info.spec.name: DatasetShards.of(
                    [(s.path, s.identity, s.num_rows) for s in info.shards]
                )
                for info in dataset_infos
            },
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON document written to ``manifests/<fingerprint>.json``."""
        return {
            "version": MANIFEST_VERSION,
            "fingerprint": self.fingerprint,
            "datasets": {
                name: {
                    "root": ds.root,
                    "shards": [[e.key, e.rows, e.identity] for e in ds.shards],
                }
                for name, ds in self.datasets.items()
            },
        }

    @classmethod
    def from_json(cls, doc: Any) -> ShardManifest:
        """Parse a manifest document; ``ValueError`` naming what is wrong."""
        if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
            found = doc.get("version") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"expected a manifest of version {MANIFEST_VERSION}, found {found!r}")
        fingerprint = doc.get("fingerprint")
        if not isinstance(fingerprint, str):
            raise ValueError(f"fingerprint: expected a string, found {fingerprint!r:.80}")
        datasets: dict[str, DatasetShards] = {}
        for name, ds in dict(doc["datasets"]).items():
            entries = tuple(
                ShardEntry(str(key), str(ident), int(rows)) for key, rows, ident in ds["shards"]
            )
            datasets[str(name)] = DatasetShards(str(ds["root"]), entries)
        return cls(fingerprint, datasets)

    def changes(self, current: ShardManifest, dataset: str) -> ShardChanges | None:
        """How ``dataset``'s shards in ``current`` differ from this manifest (None when this
        manifest does not list the dataset)."""
        old, new = self.datasets.get(dataset), current.datasets.get(dataset)
        if old is None or new is None:
            return None
        before = {e.key: e for e in old.shards}
        after = {e.key: e for e in new.shards}
        modified: list[str] = []
        times_only = False
        for key in sorted(before.keys() & after.keys()):
            a, b = before[key], after[key]
            if a.identity == b.identity and a.rows == b.rows:
                continue
            rows = f"rows {a.rows} -> {b.rows}" if a.rows != b.rows else f"rows {a.rows} unchanged"
            change = describe_change(a.identity, b.identity)
            modified.append(f"shard {new.path(b)} modified ({change}, {rows})")
            if a.rows == b.rows and only_time_changed(a.identity, b.identity):
                times_only = True
        added = tuple(
            f"shard {new.path(after[k])} added ({after[k].rows} rows)"
            for k in sorted(after.keys() - before.keys())
        )
        removed = tuple(
            f"shard {old.path(before[k])} removed ({before[k].rows} rows)"
            for k in sorted(before.keys() - after.keys())
        )
        return ShardChanges(tuple(modified), added, removed, times_only)


def manifest_dir(checkpoint_dir: str | os.PathLike[str]) -> Path:
    """Where the manifests of checkpoints in ``checkpoint_dir`` live."""
    return Path(checkpoint_dir) / MANIFEST_DIR


def save_manifest(directory: str | os.PathLike[str], manifest: ShardManifest) -> Path | None:
    """Write ``manifest`` to ``directory/<fingerprint>.json`` unless it exists (atomically).

    Returns the path, or None when it could not be written: the manifest only explains a
    refused resume, so failing to write it (logged) never fails the checkpoint.
    """
    from .checkpoint import write_atomic

    path = Path(directory) / f"{manifest.fingerprint}.json"
    if path.exists():
        return path
    data = json.dumps(manifest.to_json(), sort_keys=True, separators=(",", ":")).encode()
    try:
        write_atomic(path, data)
    except OSError as exc:
        log.warning(
            "cannot write shard manifest %s (%s); a refused resume of this checkpoint will "
            "name the dataset but not the changed shard",
            path,
            exc,
        )
        return None
    log.info("wrote shard manifest %s (%d bytes)", path, len(data))
    return path


def load_manifest(
    directories: Iterable[str | os.PathLike[str]], fingerprint: str
) -> ShardManifest | None:
    """The manifest of ``fingerprint`` from the first directory that has a readable one."""
    for directory in directories:
        path = Path(directory) / f"{fingerprint}.json"
        try:
            manifest = ShardManifest.from_json(json.loads(path.read_bytes()))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable shard manifest %s: %s", path, exc)
            continue
        if manifest.fingerprint != fingerprint:
            log.warning(
                "ignoring shard manifest %s: it is of fingerprint %s", path, manifest.fingerprint
            )
            continue
        return manifest
    return None


#: The fix for shards whose modification times alone changed (a copy that did not keep them).
COPY_HINT = (
    "a copy made without preserving modification times (cp without -p, some sync tools) "
    "changes every copied shard's time: copy with cp -p or rsync -t, or set the times back "
    "with touch -r ORIGINAL COPY, or resume on the original files"
)


def describe_data_change(
    fingerprint: str,
    datasets: Sequence[str],
    current: ShardManifest,
    directories: Sequence[str | os.PathLike[str]],
) -> tuple[str, bool]:
    """What changed in the shards of ``datasets`` since checkpoint fingerprint ``fingerprint``.

    Returns the text and whether :data:`COPY_HINT` applies (a shard changed only its time, or
    the change cannot be told without a manifest).
    """
    recorded = load_manifest(directories, fingerprint)
    parts: list[str] = []
    hint = False
    for name in datasets:
        changes = recorded.changes(current, name) if recorded is not None else None
        if changes is not None and (changes.modified or changes.added or changes.removed):
            parts.append(f"dataset {name!r}: {changes.describe()}")
            hint = hint or changes.times_only
            continue
        if recorded is None:
            where = ", ".join(str(d) for d in directories) or "no directory"
            why = f"no shard manifest {fingerprint[:16]}... found in {where} to name the file"
        else:
            why = "its shard manifest shows no difference by file"
        parts.append(
            f"dataset {name!r}: its shard list, or a shard's size, modification time or row "
            f"count, changed ({why})"
        )
        hint = True
    return "; ".join(parts), hint
