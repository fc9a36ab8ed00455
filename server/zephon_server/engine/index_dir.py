"""The index directory: where persisted shard-index entries and dataset catalogs live.

Every read and write of the index goes through one :class:`IndexDir` (``get``,
``put_atomic``, ``open_mapped``), so backing the index with something other than a local
directory (an object-store prefix) means changing this one class.

* A local directory: entries are files under it, named by the caller (``entries/ab/....zsi``);
  ``put_atomic`` writes a temporary file next to the target and renames it over the
  target, so a reader sees the old file, the new one or none, never a torn one, and two
  writers of the same name (same content) never corrupt it. A kill leaves at most a
  ``.*.tmp`` file behind, which :meth:`IndexDir.sweep_temporary` removes once it is old.
* Memory only (``root`` None, ``--index-dir none``): entries live in this process's memory,
  as every index did before the index directory existed.
* An object-store prefix (``s3://bucket/zephon-index/``): blobs are objects under it, read
  whole with ranged GETs and written with one PUT each (an S3 PUT replaces an object
  atomically, so readers and concurrent writers of the same name see one whole version);
  every server of a job and every restart share it. Requests go through the storage layer
  (retries, metrics, the standard AWS configuration: :mod:`.storage`).
* A directory that cannot be written (permissions, a read-only mount, a full disk) is a
  warning, never a crash: entries already in it are still read, new ones are kept in memory.
* Its disk use has a byte budget (``max_bytes``, ``--index-max-bytes``), enforced by
  :mod:`.index_budget` through :meth:`IndexDir.blobs` and :meth:`IndexDir.delete`; the
  ``spill/`` subdirectory of a local index holds decompressed compressed shards
  (:mod:`.spill`) under its own budget (``spill_max_bytes``) and is not a blob.

The index is a cache of what the shards say: nothing in it is ever trusted without its
checksum and key (:mod:`.shard_index`), and losing it only costs the time to rebuild.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .storage.retry import StorageRequestError

logger = logging.getLogger(__name__)

#: The ``--index-dir`` / ``index_dir`` value that keeps indexes in memory only.
NONE = "none"
#: A temporary file older than this is a writer's leftover (killed mid-write).
STALE_TMP_SECONDS = 3600.0
#: The subdirectory of a local index directory that holds spill files (not index blobs).
SPILL_SUBDIR = "spill"
#: Top-level names of a local index directory that hold index blobs.
BLOB_DIRS = ("entries", "catalogs")

Buffer = memoryview | mmap.mmap


def user_index_dir(environ: Mapping[str, str]) -> str:
    """The per-user default index directory: ``$XDG_CACHE_HOME/zephon/index``, else
    ``~/.cache/zephon/index`` (``environ`` is passed in: the library reads no environment).
    A relative ``XDG_CACHE_HOME`` is ignored, as the XDG specification says; an empty
    ``HOME`` is the user database's home."""
    xdg = environ.get("XDG_CACHE_HOME") or ""
    if os.path.isabs(xdg):
        return os.path.join(xdg, "zephon", "index")
    home = environ.get("HOME") or ""
    if not os.path.isabs(home):
        home = _account_home()
    return os.path.join(home, ".cache", "zephon", "index")


def _account_home() -> str:
    """The home directory of this process's user in the user database (``~`` without
    ``$HOME``), else the temporary directory."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir or tempfile.gettempdir()
    except (ImportError, KeyError):
        return tempfile.gettempdir()


class Blob(NamedTuple):
    """One stored blob as a listing sees it: its name, size in bytes and last write (or
    touch) time in seconds."""

    name: str
    size: int
    mtime: float


class IndexDir:
    """Reads and writes named blobs of the shard index: a local directory, or memory only.

    ``root`` None keeps everything in memory. ``writable=False`` (a directory that could not
    be written) still reads the directory but keeps new blobs in memory. ``max_bytes`` and
    ``spill_max_bytes`` are the byte budgets of the index and of its spill files (None: the
    defaults of :mod:`.index_budget` and :mod:`.spill`). Pickling keeps the root, the
    writability and the budgets (a worker process reads the same directory), not the memory.
    """

    def __init__(
        self,
        root: str | None,
        *,
        writable: bool = True,
        max_bytes: int | None = None,
        spill_max_bytes: int | None = None,
    ) -> None:
        self.root = os.path.abspath(root) if root is not None else None
        self.writable = writable and root is not None
        self.max_bytes = _budget(max_bytes, "index_max_bytes")
        self.spill_max_bytes = _budget(spill_max_bytes, "spill_max_bytes")
        #: Why writing stopped (a failed write, a full disk), None while it goes on.
        self.stopped: str | None = None
        #: Why the directory is not used at all (an object store that does not answer).
        self.unreachable: str | None = None
        self._memory: dict[str, bytes] = {}
        self._made: set[str] = set()  # directories known to exist (created once)
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        state = {
            "writable": self.writable,
            "max_bytes": self.max_bytes,
            "spill_max_bytes": self.spill_max_bytes,
            "unreachable": self.unreachable,  # a worker would pay the retry budgets again
        }
        return (self.__class__, (self.root,), state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.writable = bool(state["writable"]) and self.root is not None
        self.max_bytes = state.get("max_bytes")
        self.spill_max_bytes = state.get("spill_max_bytes")
        self.unreachable = state.get("unreachable")

    @property
    def local(self) -> bool:
        """Whether the blobs are files of a local directory."""
        return self.root is not None

    @property
    def persistent(self) -> bool:
        """Whether blobs written now outlive the process."""
        return self.writable

    def describe(self) -> str:
        """The directory, or what stands in for it, for log lines."""
        if self.root is None:
            return "memory (no index directory)"
        return self.root if self.writable else f"{self.root} (read-only: new entries in memory)"

    def where(self, name: str) -> str:
        """Where blob ``name`` lives, for messages."""
        if self.root is None or name in self._memory:
            return f"<memory>/{name}"
        return os.path.join(self.root, name)

    def get(self, name: str) -> bytes | None:
        """The bytes of blob ``name``; None when there is none (or it cannot be read, which is
        logged: the caller rebuilds it)."""
        with self._lock:
            kept = self._memory.get(name)
        if kept is not None or self.root is None:
            return kept
        try:
            with open(os.path.join(self.root, name), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            logger.warning("cannot read index file %s (%s); rebuilding it", self.where(name), exc)
            return None

    def open_mapped(self, name: str) -> Buffer | None:
        """Blob ``name`` as a read-only buffer (a memory map of the file: pages are read when
        touched and shared with every process mapping it); None when there is none."""
        with self._lock:
            kept = self._memory.get(name)
        if kept is not None:
            return memoryview(kept)
        if self.root is None:
            return None
        try:
            with open(os.path.join(self.root, name), "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    return memoryview(b"")  # an empty file: the caller finds it truncated
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError) as exc:
            logger.warning("cannot read index file %s (%s); rebuilding it", self.where(name), exc)
            return None

    def put_atomic(self, name: str, data: bytes) -> None:
        """Store ``data`` as blob ``name``: temp file, rename (in memory when the
        directory is not writable; a failed write warns once and switches to memory)."""
        if self.writable and self.root is not None:
            try:
                self._write_file(os.path.join(self.root, name), data)
                return
            except OSError as exc:
                self._stop_writing(f"writing {self.where(name)} failed: {exc}")
        with self._lock:
            self._memory[name] = bytes(data)

    def forget_memory(self) -> None:
        """Drop the blobs kept in memory (the directory's files stay)."""
        with self._lock:
            self._memory.clear()

    def blobs(self) -> list[Blob]:
        """Every blob stored in the directory (entries, catalogs and writers' temporary
        files; not the spill files), for the budget (:mod:`.index_budget`)."""
        if self.root is None:
            return []
        out: list[Blob] = []
        for top in BLOB_DIRS:
            for parent, _, names in os.walk(os.path.join(self.root, top)):
                rel = os.path.relpath(parent, self.root)
                for n in names:
                    try:
                        st = os.stat(os.path.join(parent, n))
                    except OSError:
                        continue  # removed meanwhile
                    used = st.st_blocks * 512  # disk use, not length
                    out.append(Blob(f"{rel}/{n}".replace(os.sep, "/"), used, st.st_mtime))
        return out

    def delete(self, name: str) -> bool:
        """Remove blob ``name``; whether it was there. A process that has the file mapped
        keeps reading it (Linux frees it with the last mapping); one that opens it later
        finds none and rebuilds it."""
        with self._lock:
            self._memory.pop(name, None)
        if self.root is None or not self.writable:
            return False
        try:
            os.unlink(os.path.join(self.root, name))
        except FileNotFoundError:
            return False
        return True

    def touch(self, name: str) -> None:
        """Mark blob ``name`` as used now (its modification time), so the budget evicts it
        after the blobs used less recently; a failure only costs recency."""
        if self.root is None or not self.writable:
            return
        try:
            os.utime(os.path.join(self.root, name))
        except OSError:
            pass

    def sweep_temporary(self, older_than: float = STALE_TMP_SECONDS) -> int:
        """Remove writers' leftover temporary files older than ``older_than`` seconds (a
        writer killed between write and rename); returns how many were removed."""
        if self.root is None or not self.writable:
            return 0
        removed = 0
        cutoff = time.time() - older_than
        for parent, _, names in os.walk(self.root):
            for n in names:
                path = os.path.join(parent, n)
                try:
                    if n.startswith(".") and n.endswith(".tmp") and os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
                except OSError:
                    continue
        return removed

    def _write_file(self, target: str, data: bytes) -> None:
        """Temp file + rename, without ``fsync``: a blob is derived data sealed by a checksum,
        so the rename (readers and concurrent writers see a whole file or none) is all that
        correctness needs; a crash before the data reached the disk leaves an empty or torn
        file, which fails its checksum and is rebuilt with a warning. Syncing every entry was a
        large part of a cold start over many small shards (measured in ``docs/decisions.md``,
        "Index entries are not fsynced")."""
        directory = os.path.dirname(target)
        if directory not in self._made:
            os.makedirs(directory, exist_ok=True)
            self._made.add(directory)
        tmp = os.path.join(
            directory, f".{os.path.basename(target)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        )
        try:
            fd = _create(tmp)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _stop_writing(self, reason: str) -> None:
        with self._lock:
            if not self.writable:
                return
            self.writable = False
            self.stopped = reason
        logger.warning(
            "index directory %s is not writable (%s); indexes built from now on live in "
            "memory only and are rebuilt at the next start, and large compressed shards are "
            "decompressed to %s (fix: make the directory writable, or pass --index-dir with a "
            "writable directory; --index-dir none silences this)",
            self.root,
            reason,
            os.path.join(tempfile.gettempdir(), f"zephon-spill-{os.getuid()}"),
        )


def _create(path: str) -> int:
    """A new file at ``path`` for writing. Its directory is made again if it is gone: a
    cache cleaner (or a user) that removed the index directory under a running server must
    not stop every later write (the directory is known to exist once made, so only this
    failure tells)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o644)


def _budget(value: int | None, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a number of bytes >= 0, got {value!r}")
    return value


class ObjectIndexDir(IndexDir):
    """An :class:`IndexDir` whose blobs are objects below an object-store prefix."""

    def __init__(
        self,
        root: str | None,
        *,
        writable: bool = True,
        max_bytes: int | None = None,
        spill_max_bytes: int | None = None,
    ) -> None:
        super().__init__(None, writable=False, max_bytes=max_bytes, spill_max_bytes=spill_max_bytes)
        self.root = (root or "").rstrip("/")
        self.writable = writable

    @property
    def local(self) -> bool:
        return False

    def _store(self) -> tuple[Any, str]:
        from .storage.store import shard_store

        return shard_store((self.root or "") + "/")

    def describe(self) -> str:
        return (
            str(self.root) if self.writable else f"{self.root} (read-only: new entries in memory)"
        )

    def where(self, name: str) -> str:
        return f"<memory>/{name}" if name in self._memory else f"{self.root}/{name}"

    def get(self, name: str) -> bytes | None:
        from .storage.retry import StorageRequestError

        with self._lock:
            kept = self._memory.get(name)
        if kept is not None or self.unreachable is not None:
            return kept
        store, prefix = self._store()
        try:
            return bytes(store.read_all(prefix + name))
        except StorageRequestError as exc:
            if exc.outcome != "not_found":
                logger.warning(
                    "cannot read index object %s (%s); rebuilding it", self.where(name), exc
                )
            return None

    def open_mapped(self, name: str) -> Buffer | None:
        data = self.get(name)
        return None if data is None else memoryview(data)

    def put_atomic(self, name: str, data: bytes) -> None:
        from .storage.retry import StorageRequestError

        if self.writable:
            store, prefix = self._store()
            try:
                store.write_atomic(prefix + name, bytes(data))
                return
            except StorageRequestError as exc:
                self._stop_writing(f"writing {self.where(name)} failed: {exc}")
        with self._lock:
            self._memory[name] = bytes(data)

    def sweep_temporary(self, older_than: float = STALE_TMP_SECONDS) -> int:
        return 0  # a PUT leaves no temporary object behind

    def blobs(self) -> list[Blob]:
        if self.unreachable is not None:
            return []
        store, prefix = self._store()
        out: list[Blob] = []
        for info in store.list(prefix):
            name = info.key[len(prefix) :]
            if name.split("/", 1)[0] in BLOB_DIRS:
                out.append(Blob(name, info.size, info.mtime_ns / 1e9))
        return out

    def delete(self, name: str) -> bool:
        with self._lock:
            self._memory.pop(name, None)
        if not self.writable:
            return False
        store, prefix = self._store()
        store.delete(prefix + name)
        return True

    def touch(self, name: str) -> None:
        pass  # an object's time is its last PUT: recency on a store is the last write


def _object_write_problem(root: str) -> str | None:
    """Why no object can be written below ``root`` (None: a probe object was written and
    deleted)."""
    failed = _object_probe(root)
    return None if failed is None else str(failed)


def _object_probe(root: str) -> StorageRequestError | None:
    """The failure of writing and deleting a probe object below ``root`` (None: it worked)."""
    from .storage.retry import StorageRequestError
    from .storage.store import shard_store

    store, prefix = shard_store(root.rstrip("/") + "/")
    probe = f"{prefix}.probe.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        store.write_atomic(probe, b"zephon")
        store.delete(probe)
    except StorageRequestError as exc:
        return exc
    return None


def _probe_object_dir(found: ObjectIndexDir) -> str | None:
    """Probe an object-store index directory: one that does not answer at all (a network
    failure, throttling or server errors through the whole retry budget) is not used, so
    that no start pays that budget again for every catalog and entry it would read."""
    from .storage.retry import RETRYABLE

    failed = _object_probe(found.root or "")
    if failed is not None and failed.outcome in RETRYABLE:
        found.unreachable = str(failed)
        logger.warning(
            "index directory %s does not answer (%s); the index is not used by this process "
            "(every shard is indexed in memory). It is reached with the storage_options of a "
            "dataset in the same bucket, else the standard AWS configuration "
            "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)",
            found.root,
            failed,
        )
    return None if failed is None else str(failed)


_opened: dict[str, IndexDir] = {}
_opened_lock = threading.Lock()


def open_index_dir(
    location: str | None, *, max_bytes: int | None = None, spill_max_bytes: int | None = None
) -> IndexDir | None:
    """The process's :class:`IndexDir` for ``location`` (one per directory, so a problem is
    logged once), with these budgets (None: the defaults); None for ``None`` or ``"none"``
    (memory only, the caller's own cache).

    The directory is created if needed and checked by writing a probe file; a directory
    that cannot be written is a warning (entries in it are still read, new ones stay in
    memory), never an error.
    """
    if location is None or location == NONE:
        return None
    from .storage.location import is_url

    remote = is_url(location)
    root = location.rstrip("/") if remote else os.path.abspath(os.path.expanduser(location))
    with _opened_lock:
        found = _opened.get(root)
        if found is None:
            found = _opened[root] = ObjectIndexDir(root) if remote else IndexDir(root)
            if isinstance(found, ObjectIndexDir):
                problem = _probe_object_dir(found)
            else:
                problem = write_problem(root)
            if found.unreachable is not None:
                found.writable = False
                found.stopped = problem
            elif problem is not None:
                found._stop_writing(problem)
            else:
                logger.info("shard index directory %s", root)
                if not remote:
                    _remove_legacy_spills(os.path.join(root, SPILL_SUBDIR))
        found.max_bytes = _budget(max_bytes, "index_max_bytes")
        found.spill_max_bytes = _budget(spill_max_bytes, "spill_max_bytes")
        return found


_LEGACY_SPILL = re.compile(r"[0-9a-f]{40}\.jsonl")


def _remove_legacy_spills(directory: str) -> None:
    """Remove the spill files of earlier versions, named ``<hash>.jsonl``: an index directory
    under a dataset's path made them shards of that dataset (the spill files of today end in
    ``.spill``). Before any dataset is listed, so that no start reads them."""
    try:
        names = [n for n in os.listdir(directory) if _LEGACY_SPILL.fullmatch(n)]
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))
            logger.info("removed spill file %s of an earlier version", name)


def location_write_problem(location: str) -> str | None:
    """:func:`write_problem` of a local directory or an object-store prefix."""
    from .storage.location import is_url

    if is_url(location):
        return _object_write_problem(location)
    return write_problem(os.path.abspath(os.path.expanduser(location)))


def write_problem(root: str) -> str | None:
    """Why nothing can be written in directory ``root`` (None: it exists, or was created,
    and a probe file was written and removed)."""
    probe = os.path.join(root, f".probe.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.makedirs(root, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"zephon")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:  # also when the write failed (a full disk): no probe is left per start
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None
