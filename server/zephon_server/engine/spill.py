"""Spill files: the decompressed content of large compressed shards, on disk, under a budget.

A ``.jsonl.gz`` or single-frame ``.jsonl.zst`` shard cannot be read from the middle: its rows
come out of one decompression from the start. Holding that content in memory does not scale
(a shard of tens of GB), and decompressing it again for every read does not either. So a
compressed shard whose content is larger than the cache's *spill threshold* (64 MiB, or the
shard cache's byte budget if that is smaller, but at least 1 MiB) is stream-decompressed
once into a *spill file*, plain JSONL bytes, and its rows are then read at their offsets
with ``pread`` like a plain JSONL shard's. Memory stays one decoder buffer (about a MiB)
whatever the shard's size; the line starts (8 bytes per row) are computed as the content
goes by.

**Where.** ``<index-dir>/spill/`` for a local, writable index directory (the same disk as
the index, shared by the processes and restarts that share the index); else
``<tmp>/zephon-spill-<uid>/``. A file is named by a hash of the shard's location, identity
and format, so a rewritten shard never meets its old content; it is written to a temporary
name and renamed once its decompression was verified complete, so a file under its final
name is always whole.

**Budget.** At most ``spill_max_bytes`` (``--spill-max-bytes``; default a tenth of the
filesystem, at most :data:`DEFAULT_CAP`): before a spill, least recently used files are
removed to make room (a file's time is its last use, refreshed at most every
:data:`TOUCH_EVERY` seconds), under an ``flock`` of ``.lock`` shared by the processes. A
reader opens the file for each read, so a file removed by another process is simply spilled
again; an open one stays readable until closed. A shard whose content alone exceeds the
budget (or a disk that fills up) stops being written as soon as that is known, is still
counted, and reading it is a :class:`SpillError` naming the fix (unless it is a multi-frame
zstd shard, which is read frame by frame and needs no spill).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from .errors import DataError
from .line_index import newline_starts

logger = logging.getLogger(__name__)

GIB = 1 << 30
#: Content up to this size is decompressed into memory (the shard cache's LRU), as before.
DEFAULT_THRESHOLD = 64 << 20
#: A smaller shard cache budget lowers the threshold, but never below this: decompressing a
#: content this small again costs less than writing and reading a file.
MIN_THRESHOLD = 1 << 20
#: :attr:`Unspilled.reason` of a content that was only counted (nothing asked to keep it).
COUNTED_ONLY = "counted only"
#: :attr:`Unspilled.reason` of a local multi-frame zstd shard (read frame by frame instead).
FRAMED = "read frame by frame (several zstd frames)"
#: Default budget: this share of the spill filesystem's size, at most :data:`DEFAULT_CAP`.
DEFAULT_SHARE = 0.10
DEFAULT_CAP = 64 * GIB
#: A spill file's time is refreshed by a use at most this often (seconds).
TOUCH_EVERY = 60.0
#: Another writer's temporary file older than this is a leftover (killed mid-spill).
STALE_TMP_SECONDS = 3600.0
#: Not a shard extension: an index directory under a dataset's path must not make its spill
#: files (plain JSONL bytes) shards of that dataset (``index_dir`` removes the ``.jsonl`` ones
#: of earlier versions when it opens the directory).
SUFFIX = ".spill"
LOCK_NAME = ".lock"
FIX = (
    "raise --spill-max-bytes / spill_max_bytes (or free disk space in the spill directory), "
    "recompress the shard in independent frames so it is read frame by frame "
    "(zstd -B16M ... or pzstd), or split it into smaller shards"
)

#: A shard version: (location, format, identity).
Key = tuple[str, str, str]


class SpillError(DataError):
    """A compressed shard that must be spilled to be read, and cannot be (over the spill
    budget, or the spill directory's disk is full)."""


@dataclass(frozen=True)
class Spilled:
    """The content of a shard in spill file ``path`` (``size`` bytes) and its line starts."""

    path: str
    size: int
    starts: np.ndarray


@dataclass(frozen=True)
class Unspilled:
    """A content that was counted (its line ``starts``) but not kept: ``reason`` says why."""

    size: int
    starts: np.ndarray
    reason: str


class SpillDir:
    """A directory of spill files with a byte budget (see the module docstring).

    ``max_bytes`` None: a tenth of the filesystem, at most :data:`DEFAULT_CAP`. Picklable
    (its root and budget), so a worker process spills into the same directory.
    """

    def __init__(self, root: str, max_bytes: int | None = None) -> None:
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
        ):
            raise ValueError(f"spill_max_bytes must be a number of bytes >= 0, got {max_bytes!r}")
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (SpillDir, (self.root, self.max_bytes))

    @classmethod
    def for_index(cls, store: Any) -> SpillDir:
        """The spill directory of a shard cache on index directory ``store`` (an
        :class:`~.index_dir.IndexDir` or None): ``<root>/spill`` when it is local and
        writable, else a per-user directory under the system's temporary directory."""
        budget = getattr(store, "spill_max_bytes", None)
        if store is not None and store.local and store.writable and store.root:
            return cls(os.path.join(store.root, "spill"), budget)
        return cls(os.path.join(tempfile.gettempdir(), f"zephon-spill-{os.getuid()}"), budget)

    def budget(self) -> int:
        """The byte budget (``max_bytes`` or the default of its filesystem)."""
        if self.max_bytes is not None:
            return self.max_bytes
        probe = self.root
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        fs = os.statvfs(probe)
        return min(int(fs.f_blocks * fs.f_frsize * DEFAULT_SHARE), DEFAULT_CAP)

    def path(self, key: Key) -> str:
        """Where the content of shard version ``key`` is spilled."""
        text = json.dumps(list(key), separators=(",", ":"))
        return os.path.join(self.root, hashlib.sha256(text.encode()).hexdigest()[:40] + SUFFIX)

    def find(self, key: Key, end: int) -> Spilled | None:
        """The spill file of ``key`` if it is there and whole (``end`` is the last line
        start: the content has ``end`` bytes, or ``end - 1`` when its last line has no
        newline), its use refreshing its time; None when absent (a file of another size is
        removed). The caller supplies the starts."""
        path = self.path(key)
        try:
            size = os.stat(path).st_size
        except OSError:
            return None
        if size not in (end, end - 1):
            logger.warning("spill file %s has %d bytes, expected %d; removing it", path, size, end)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        self.used(path)
        return Spilled(path, size, np.zeros(0, dtype=np.int64))

    def used(self, path: str) -> None:
        """Refresh the time of ``path`` (at most every :data:`TOUCH_EVERY` seconds)."""
        now = time.monotonic()
        with self._lock:
            if now - self._touched.get(path, -TOUCH_EVERY) < TOUCH_EVERY:
                return
            self._touched[path] = now
            if len(self._touched) > 4096:
                self._touched.clear()
        with contextlib.suppress(OSError):
            os.utime(path)

    def sink(
        self,
        key: Key,
        threshold: int,
        expected: int,
        keep: bool = True,
        frames: list[Any] | None = None,
    ) -> SpillSink:
        """A decompression sink for ``key``: memory up to ``threshold`` bytes, then a spill
        file (at once when the header's ``expected`` size is larger); ``keep=False`` (only
        counting, as ``zephon index`` does) writes no file: the content over the threshold
        is only scanned for its line starts. ``frames``: the decoder's frame table of a
        shard that can be read frame by frame; once it shows a second frame, nothing more
        is spilled (see :data:`FRAMED`)."""
        return SpillSink(self, key, threshold, expected, keep, frames)

    def make_room(self, nbytes: int, keep: str = "") -> None:
        """Remove least recently used spill files until ``nbytes`` more fit the budget
        (never ``keep``)."""
        limit = self.budget()
        stale = time.time() - STALE_TMP_SECONDS
        with self.locked():
            files = self._files()
            total = sum(size for _, size, _ in files)
            for path, size, mtime in sorted(files, key=lambda f: f[2]):
                if total + nbytes <= limit:
                    break
                if path == keep or (path.endswith(".tmp") and mtime > stale):
                    continue  # a spill in progress (of this or another process)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    logger.info("removed spill file %s (%d bytes) for room", path, size)
                total -= size

    def usage(self) -> int:
        """Bytes of disk the spill files take now."""
        return sum(size for _, size, _ in self._files())

    def _files(self) -> list[tuple[str, int, float]]:
        out = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        for name in names:
            if not name.endswith(SUFFIX) and not name.endswith(".tmp"):
                continue
            path = os.path.join(self.root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((path, st.st_blocks * 512, st.st_mtime))
        return out

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive against other processes changing the directory."""
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(os.path.join(self.root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


class SpillSink:
    """Where a decompression writes: memory up to a threshold, then a spill file.

    ``result()`` is the content (``bytearray``) while it stayed under the threshold, else a
    :class:`Spilled` (the file renamed into place, with the line starts computed while
    writing) or an :class:`Unspilled` (the file would not fit the budget or the disk: it was
    dropped, the starts were still computed). Call :meth:`discard` if decompression fails.
    """

    def __init__(
        self,
        spill: SpillDir,
        key: Key,
        threshold: int,
        expected: int,
        keep: bool = True,
        frames: list[Any] | None = None,
    ) -> None:
        self.spill = spill
        self.key = key
        self.threshold = threshold
        self.keep = keep
        self.frames = frames
        self.limit = spill.budget() if keep else 0
        self.buf = bytearray(expected if 0 <= expected <= threshold else 0)
        self.pos = 0
        self.total = 0
        self.file: BinaryIO | None = None
        self.tmp = ""
        self.committed = ""  # the spill file once renamed into place
        self.dropped = ""  # why the content is no longer kept
        self.pieces: list[np.ndarray] = []
        self.last = 10
        if expected > threshold:
            self._to_file(max(expected, threshold))

    def write(self, data: bytes) -> None:
        """Take the next ``data`` of the content."""
        n = len(data)
        if self.file is None and not self.dropped:
            if self.total + n <= self.threshold:
                room = len(self.buf) - self.pos
                if n > room:
                    self.buf.extend(bytes(n - room))
                self.buf[self.pos : self.pos + n] = data
                self.pos += n
                self.total += n
                return
            self._to_file(self.total + n)
        self._scan(data, self.total)
        self.total += n
        if self.frames and self.file is not None:  # a frame ended and more content follows
            self._drop(FRAMED)
        if self.file is not None:
            if self.total > self.limit:  # more than the header said
                self._drop(f"it decompresses to more than the spill budget of {self.limit} bytes")
            else:
                try:
                    self.file.write(data)
                except OSError as exc:
                    self._drop(_disk_problem(exc, self.spill.root))

    def result(self) -> bytearray | Spilled | Unspilled:
        """The content in memory, spilled, or counted only (see the class docstring)."""
        if self.file is None and not self.dropped:
            del self.buf[self.pos :]
            return self.buf
        if self.total and self.last != 10:
            self.pieces.append(np.array([self.total + 1], dtype=np.int64))
        starts = np.concatenate([np.zeros(1, dtype=np.int64), *self.pieces])
        if self.dropped:
            return Unspilled(self.total, starts, self.dropped)
        assert self.file is not None
        try:
            self.file.close()
            self.file = None
            target = self.spill.path(self.key)
            os.replace(self.tmp, target)
            self.committed = target
        except OSError as exc:
            self._drop(_disk_problem(exc, self.spill.root))
            return Unspilled(self.total, starts, self.dropped)
        self.spill.make_room(0, keep=target)  # estimates may have been short
        logger.info("spilled %s: %d bytes of content to %s", self.key[0], self.total, target)
        return Spilled(target, self.total, starts)

    def discard(self) -> None:
        """Remove what a decompression that failed (or whose shard changed meanwhile)
        wrote: its temporary file, or its spill file if already renamed into place."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
        for path in (self.tmp, self.committed):
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        self.committed = ""

    def _to_file(self, estimate: int) -> None:
        """Move the content so far to a new temporary spill file (or drop it)."""
        content = memoryview(self.buf)[: self.pos]
        self._scan(content, 0)
        reason = ""
        if not self.keep:
            reason = COUNTED_ONLY
        elif self.frames:
            reason = FRAMED
        elif estimate > self.limit:
            reason = f"it decompresses to more than the spill budget of {self.limit} bytes"
        if reason:
            content.release()
            self.buf = bytearray()
            self._drop(reason)
            return
        try:
            self.spill.make_room(estimate)
            name = f".{os.path.basename(self.spill.path(self.key))}.{uuid.uuid4().hex[:8]}.tmp"
            self.tmp = os.path.join(self.spill.root, name)
            self.file = open(self.tmp, "xb")  # noqa: SIM115 - closed in result()/discard()
            self.file.write(content)
        except OSError as exc:
            self._drop(_disk_problem(exc, self.spill.root))
        content.release()
        self.buf = bytearray()
        self.pos = 0

    def _scan(self, data: bytes | memoryview, offset: int) -> None:
        if not len(data):
            return
        self.pieces.append(newline_starts(data, offset))
        self.last = int(memoryview(data).cast("B")[-1])

    def _drop(self, reason: str) -> None:
        self.discard()
        self.dropped = reason


def _disk_problem(exc: OSError, root: str) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the spill directory {root} is out of disk space ({exc.strerror})"
    return f"the spill file cannot be written in {root} ({exc})"


def spill_error(path: str, fmt: str, reason: str) -> SpillError:
    """The error for reading a shard whose content could not be spilled."""
    return SpillError(
        f"cannot read compressed shard {path} ({fmt}): its content is too large to hold in "
        f"memory and cannot be spilled to disk: {reason}; fix: {FIX}"
    )
