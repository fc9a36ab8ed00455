"""Byte budgets for on-disk caches, and the ledger that enforces one across processes.

The replay cache (:mod:`.replay_cache`) shares its filesystem with the checkpoints, which
matter far more: a checkpoint that cannot be written loses training progress, a cache entry
that is not written only costs a re-tokenization on resume. So a cache gets a
:class:`CacheBudget`: at most ``max_bytes`` of disk, and it never writes when that would
leave less than ``reserve_bytes`` free on the filesystem (the room kept for checkpoints).

Several processes write one cache (the ``processes`` runner's workers each tokenize), so the
bytes in use are kept in a small :class:`CacheLedger` file at the cache's root, read and
updated under an exclusive ``flock``; every write, eviction and recount of the cache happens
under that lock, so the ledger is the truth between recounts. It also holds the skip
counters that ``/metrics`` shows (they must add up over worker processes). The record has a
fixed size and is rewritten in place, so updating it needs no new disk blocks even on a full
disk (it is allocated when the cache is first bound, by :meth:`CacheLedger.locked`).

Sizes are disk usage, not file lengths: each file and directory is counted rounded up to the
filesystem's block size (``statvfs().f_frsize``), which is what it takes from the disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
#: Default budget: this share of the cache filesystem's size, at most ``DEFAULT_CAP``.
DEFAULT_SHARE = 0.10
DEFAULT_CAP = 8 * GIB
#: Free space the cache leaves on its filesystem: this share of its size, at most 1 GiB.
RESERVE_SHARE = 0.05
RESERVE_CAP = GIB
LEDGER_NAME = ".ledger"
_LEDGER = struct.Struct("<8s6Q")
_MAGIC = b"ZRCLEDG1"


def _filesystem(path: Path) -> os.statvfs_result:
    """``statvfs`` of the filesystem ``path`` is (or will be) on: its nearest existing parent."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.statvfs(probe)


@dataclass(frozen=True)
class CacheBudget:
    """How much disk a cache may take (``max_bytes``) and how much it leaves free
    (``reserve_bytes``); ``block``: the filesystem's allocation unit sizes are rounded to."""

    max_bytes: int
    reserve_bytes: int = 0
    block: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_bytes", "reserve_bytes", "block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"cache budget: {name} must be an integer >= 0, got {value!r}")
        if self.block < 1:
            raise ValueError(f"cache budget: block must be >= 1, got {self.block!r}")

    @classmethod
    def for_path(cls, path: str | os.PathLike[str], max_bytes: int | None = None) -> CacheBudget:
        """The budget for a cache at ``path``: ``max_bytes``, or by default 10% of its
        filesystem's size (at most 8 GiB); the reserve is 5% of that size (at most 1 GiB)."""
        fs = _filesystem(Path(path))
        size = fs.f_blocks * fs.f_frsize
        if max_bytes is None:
            max_bytes = min(int(size * DEFAULT_SHARE), DEFAULT_CAP)
        reserve = min(int(size * RESERVE_SHARE), RESERVE_CAP)
        return cls(max_bytes=max_bytes, reserve_bytes=reserve, block=fs.f_frsize or 4096)

    def disk_size(self, nbytes: int) -> int:
        """Disk usage of a file of ``nbytes`` bytes (whole blocks; a directory is one)."""
        return max(1, -(-nbytes // self.block)) * self.block


def tree_usage(path: Path, budget: CacheBudget, *, skip: str = "") -> int:
    """Disk usage of the files and directories below ``path`` (``path`` itself excluded),
    counted as :meth:`CacheBudget.disk_size` does; entries named ``skip`` are left out."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        if entry.name == skip:
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                total += budget.block + tree_usage(Path(entry.path), budget)
            else:
                total += budget.disk_size(entry.stat(follow_symlinks=False).st_size)
        except OSError:
            continue  # removed meanwhile
    return total


@dataclass
class LedgerCounts:
    """The ledger's record: bytes in use and what the cache did not write, and why."""

    bytes: int = 0
    evicted_bytes: int = 0
    skipped_budget: int = 0  # an entry did not fit in the budget, even after eviction
    skipped_low_disk: int = 0  # writing would have left less than the reserve free
    skipped_disk_full: int = 0  # ENOSPC / EDQUOT, and writes skipped in the pause after one


class CacheLedger:
    """The byte ledger of one cache directory, shared by every process writing it.

    :meth:`locked` holds the ledger exclusively (against other threads and processes: each
    call opens its own descriptor, and ``flock`` locks are per open file) and writes the
    counts back when the block ends. Picklable: it is only a path.
    """

    def __init__(self, root: Path) -> None:
        self.path = root / LEDGER_NAME

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    @staticmethod
    def _read(fd: int) -> LedgerCounts:
        raw = os.pread(fd, _LEDGER.size, 0)
        if len(raw) < _LEDGER.size or raw[:8] != _MAGIC:
            return LedgerCounts()  # new or damaged: the next recount fixes the bytes
        return LedgerCounts(*_LEDGER.unpack(raw)[1:6])

    @contextlib.contextmanager
    def locked(self) -> Iterator[LedgerCounts]:
        """The counts, held exclusively for the block; written back when it ends (also
        when it raises: the body updates them right after each change on disk)."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            counts = self._read(fd)
            before = dataclasses.astuple(counts)
            try:
                yield counts
            finally:
                if dataclasses.astuple(counts) != before or os.fstat(fd).st_size < _LEDGER.size:
                    counts.bytes = max(0, counts.bytes)
                    os.pwrite(fd, _LEDGER.pack(_MAGIC, *dataclasses.astuple(counts), 0), 0)
        finally:
            os.close(fd)  # releases the lock

    def snapshot(self) -> LedgerCounts | None:
        """The counts now (shared lock), or None when there is no ledger yet."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return self._read(fd)
        finally:
            os.close(fd)  # releases the lock
