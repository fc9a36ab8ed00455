"""The index directory's byte budget: which entries and catalogs go when it is full.

An index directory only grows: every new shard version adds an entry, every new listing of a
dataset a catalog, and nothing a rewritten or removed shard left behind is ever read again.
So the directory has a budget (``--index-max-bytes``, YAML ``index_max_bytes``; by default a
tenth of its filesystem, at most :data:`DEFAULT_CAP`), and :func:`prune` brings it back within
it, removing in this order:

1. *orphans*: entries no catalog refers to (a shard rewritten or removed), and catalogs that
   cannot be read or are of another version; oldest first. An orphan younger than
   ``grace`` (an hour) is kept: it may belong to a build whose catalog is not written yet;
2. whole *catalogs*, least recently used first (a catalog's time is its last write or the
   last start that read it), each with the entries no remaining catalog refers to.

Never removed: the catalogs this process uses (``pinned``: a server's own datasets) and the
entries of their shards, nor writers' temporary files (:meth:`.index_dir.IndexDir.
sweep_temporary` removes old ones). When what is pinned alone exceeds the budget, the
report says so (``over_budget``) and the caller warns: nothing the server needs is removed.

Concurrent servers sharing the directory stay correct whatever is removed under them: an
entry a process has mapped stays readable (Linux frees the file with its last mapping), and
an entry or catalog that is gone when a process opens it is rebuilt from the shard, like a
damaged one. Removal only costs that rebuild. On a local directory, two prunes never run at
once (an ``flock`` on ``.prune.lock``; the second one skips). An object-store index goes
through the same code (a listing, a GET per unpinned catalog, a DELETE per removed object);
its recency is the last write, since an object cannot be touched.

The budget is enforced at each start that wrote to the index (a warm start writes nothing and
so cannot grow it), after ``zephon index``, and by ``zephon index --prune``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .index_catalog import Listing, catalog_listing, entry_names
from .index_dir import Blob, IndexDir
from .shard_index import ENTRY_SUFFIX, CorruptIndexEntry, ShardIndex

logger = logging.getLogger(__name__)

GIB = 1 << 30
#: Default budget: this share of the index filesystem's size, at most :data:`DEFAULT_CAP`.
DEFAULT_SHARE = 0.10
DEFAULT_CAP = 32 * GIB
#: Default budget of an object-store index directory (it has no filesystem to measure).
DEFAULT_OBJECT_STORE = DEFAULT_CAP
#: An orphan entry younger than this is kept (a build in progress has not written its
#: catalog yet).
ORPHAN_GRACE_SECONDS = 3600.0
LOCK_NAME = ".prune.lock"
CATALOG_SUFFIX = ".zsc"


def default_max_bytes(store: IndexDir) -> int:
    """The budget of ``store`` when none is given: :data:`DEFAULT_SHARE` of its filesystem
    (of the nearest existing parent), at most :data:`DEFAULT_CAP`."""
    if not store.local or store.root is None:
        return DEFAULT_OBJECT_STORE
    probe = store.root
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    fs = os.statvfs(probe)
    return min(int(fs.f_blocks * fs.f_frsize * DEFAULT_SHARE), DEFAULT_CAP)


def max_bytes_of(store: IndexDir) -> int:
    """The budget of ``store``: its ``max_bytes``, else :func:`default_max_bytes`."""
    return store.max_bytes if store.max_bytes is not None else default_max_bytes(store)


@dataclass(frozen=True)
class PruneReport:
    """What one :func:`prune` found and removed (sizes in bytes of disk or storage)."""

    location: str
    max_bytes: int
    bytes_before: int
    bytes_after: int
    pinned_bytes: int
    orphans_removed: int = 0
    catalogs_removed: int = 0
    entries_removed: int = 0
    bytes_removed: int = 0
    skipped: bool = False  # another process was pruning the directory

    @property
    def over_budget(self) -> bool:
        """Whether the directory is still over its budget (only pinned blobs are left)."""
        return not self.skipped and self.bytes_after > self.max_bytes

    def summary(self) -> str:
        """One line for logs and ``zephon index --prune``."""
        if self.skipped:
            return f"index directory {self.location}: another process is pruning it; skipped"
        return (
            f"index directory {self.location}: removed {self.orphans_removed} orphan(s), "
            f"{self.catalogs_removed} least recently used catalog(s) and "
            f"{self.entries_removed} of their entries ({self.bytes_removed} bytes); "
            f"{self.bytes_after} of {self.max_bytes} bytes used, {self.pinned_bytes} by the "
            "datasets in use"
        )


class _Plan:
    """The directory as one prune sees it: blobs, catalogs' references, running total."""

    def __init__(self, store: IndexDir, pinned: Mapping[str, Listing]) -> None:
        self.store = store
        self.blobs = {b.name: b for b in store.blobs()}
        self.total = sum(b.size for b in self.blobs.values())
        self.pinned_entries = {n for listing in pinned.values() for n in entry_names(listing)}
        self.pinned_catalogs = set(pinned)
        self.unusable: list[Blob] = []  # damaged catalogs, or of another version
        self.catalogs: dict[str, list[str]] = {}  # unpinned catalog -> its entries
        self.refs: Counter[str] = Counter(self.pinned_entries)
        for blob in self.blobs.values():
            if not blob.name.endswith(CATALOG_SUFFIX) or blob.name in self.pinned_catalogs:
                continue
            names = self._catalog_entries(blob.name)
            if names is None:
                self.unusable.append(blob)
                continue
            self.catalogs[blob.name] = names
            self.refs.update(names)
        self.removed = Counter[str]()

    def _catalog_entries(self, name: str) -> list[str] | None:
        data = self.store.get(name)
        if data is None:
            return []  # removed meanwhile: refers to nothing
        try:
            return entry_names(catalog_listing(memoryview(data)))
        except CorruptIndexEntry:
            return None

    def remove(self, blob: Blob, kind: str) -> None:
        if self.store.delete(blob.name):
            self.removed[kind] += 1
            self.removed["bytes"] += blob.size
        self.total -= blob.size
        self.blobs.pop(blob.name, None)

    def orphans(self, cutoff: float) -> list[Blob]:
        """Unreferenced entries older than ``cutoff`` and unusable catalogs, oldest first."""
        found = [
            b
            for b in self.blobs.values()
            if b.name.endswith(ENTRY_SUFFIX) and not self.refs[b.name] and b.mtime < cutoff
        ]
        return sorted(found + self.unusable, key=lambda b: b.mtime)

    def drop_catalog(self, name: str) -> None:
        self.remove(self.blobs[name], "catalogs")
        for entry in self.catalogs.pop(name):
            self.refs[entry] -= 1
            blob = self.blobs.get(entry)
            if blob is not None and self.refs[entry] <= 0:
                self.remove(blob, "entries")

    def pinned_bytes(self) -> int:
        names = self.pinned_entries | self.pinned_catalogs
        return sum(b.size for n, b in self.blobs.items() if n in names)


def prune(
    store: IndexDir,
    pinned: Mapping[str, Listing],
    *,
    max_bytes: int | None = None,
    all_orphans: bool = False,
    grace: float = ORPHAN_GRACE_SECONDS,
    now: float | None = None,
) -> PruneReport:
    """Bring ``store`` within ``max_bytes`` (default: its budget), never removing the
    catalogs ``pinned`` (name -> listing) nor their shards' entries (see the module
    docstring). ``all_orphans`` removes every orphan older than ``grace`` seconds even under
    the budget (``zephon index --prune``)."""
    limit = max_bytes_of(store) if max_bytes is None else max_bytes
    where = str(store.root) if store.root is not None else "<memory>"
    with _exclusive(store) as mine:
        if not mine:
            return PruneReport(where, limit, 0, 0, 0, skipped=True)
        plan = _Plan(store, pinned)
        before = plan.total
        cutoff = (time.time() if now is None else now) - grace
        for blob in plan.orphans(cutoff):
            if not all_orphans and plan.total <= limit:
                break
            plan.remove(blob, "orphans")
        lru = sorted(plan.catalogs, key=lambda n: plan.blobs[n].mtime)
        for name in lru:
            if plan.total <= limit:
                break
            plan.drop_catalog(name)
        return PruneReport(
            where,
            limit,
            before,
            plan.total,
            plan.pinned_bytes(),
            orphans_removed=plan.removed["orphans"],
            catalogs_removed=plan.removed["catalogs"],
            entries_removed=plan.removed["entries"],
            bytes_removed=plan.removed["bytes"],
        )


def enforce(index: ShardIndex) -> PruneReport | None:
    """:func:`prune` ``index``'s directory with this process's catalogs pinned, logging what
    was removed and warning when the pinned datasets alone exceed the budget (the fix is in
    the message). None when the index is not persistent (memory only, read-only)."""
    if not index.store.persistent:
        return None
    report = prune(index.store, index.pinned())
    if report.bytes_removed:
        logger.info("%s", report.summary())
    if report.over_budget:
        logger.warning(
            "index directory %s: the datasets in use need %d bytes of index, more than its "
            "budget of %d bytes; nothing they need is removed (fix: raise --index-max-bytes "
            "/ index_max_bytes, or give the index a larger filesystem)",
            report.location,
            report.bytes_after,
            report.max_bytes,
        )
    return report


@contextlib.contextmanager
def _exclusive(store: IndexDir) -> Iterator[bool]:
    """Whether this process may prune ``store`` now (local: a non-blocking ``flock``)."""
    if not store.local or store.root is None:
        yield True
        return
    try:
        fd = os.open(os.path.join(store.root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
