"""Who owns a shared-memory payload block, and the sweep of blocks whose owner died.

The processes runner's workers put payload arrays into blocks under ``/dev/shm``
(:mod:`.shm`) and the server process unlinks each block once it has read it. A server killed
with SIGKILL cannot; multiprocessing's resource tracker then unlinks what it knows of once
the server's workers have exited too, but a tracker killed with them (a whole process group
killed) leaves everything. So every block names its owner and any later process can tell
whether that owner still lives:

* The owner (the process that runs the pool) holds an exclusive ``flock`` on its *owner
  file* ``zephon-owner-<pid>-<token>`` for its whole life. The kernel drops the lock when
  the process dies, however it dies; nothing else can take it while the process lives.
* A block is named ``zephon-blk-<pid>-<token>-<random>``: ``<pid>`` tells people which
  process made it, ``<token>`` (random) keeps owners apart even when a pid is reused or when
  containers with their own pid namespaces share one ``/dev/shm``, where pids say nothing.
* The owner file lists the named semaphores (``sem.mp-*``) that the owner's process pools
  made (multiprocessing's queues make them, randomly named, under the ``spawn`` method).

:func:`sweep_stale` (at server start-up, and before a process first owns blocks) removes,
for each owner whose lock it can take or whose owner file is gone, that owner's blocks, its
listed semaphores and then its owner file. A live owner's lock cannot be taken, so a live
process's blocks are never touched, and names it cannot attribute (other programs'
``psm_*`` blocks, unlisted semaphores) are left alone. Needs a listable ``/dev/shm`` (Linux);
elsewhere blocks get multiprocessing's own names and nothing is swept.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no owner files, nothing is swept
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
BLOCK_PREFIX = "zephon-blk-"
OWNER_PREFIX = "zephon-owner-"
_OWNER = r"\d+-[0-9a-f]{12}"
_BLOCK_RE = re.compile(rf"{BLOCK_PREFIX}({_OWNER})-[0-9a-f]{{8}}")
_OWNER_RE = re.compile(rf"{OWNER_PREFIX}({_OWNER})")
_SEMAPHORE_RE = re.compile(r"sem\.mp-[A-Za-z0-9_]+")


@dataclass
class _Registration:
    """This process's owner identity; ``fd`` is the locked owner file (None when adopted
    from the process that runs the pool, in one of its workers)."""

    owner: str
    pid: int
    fd: int | None
    semaphores: set[str] = field(default_factory=set)


_lock = threading.Lock()
_registration: _Registration | None = None
_unavailable = False  # registration failed once in this process (logged): do not retry


def owner_id() -> str | None:
    """This process's owner id (``<pid>-<token>``), registered on first use after sweeping
    the blocks of dead owners; ``None`` where blocks cannot be attributed (no ``/dev/shm``)."""
    global _registration, _unavailable
    with _lock:
        reg = _registration
        if reg is not None and (reg.fd is None or reg.pid == os.getpid()):
            return reg.owner
        if _unavailable or fcntl is None or not SHM_DIR.is_dir():
            return None
        _sweep(own=None)
        _registration = _register()
        _unavailable = _registration is None
        return _registration.owner if _registration else None


def adopt(owner: str | None) -> None:
    """Worker side: name blocks after ``owner`` (the process that runs the pool)."""
    global _registration
    with _lock:
        _registration = None if owner is None else _Registration(owner, os.getpid(), None)


def block_name() -> str | None:
    """A fresh name for a payload block of this process's owner (``None``: let
    multiprocessing choose one; the block then cannot be swept)."""
    owner = owner_id()
    return None if owner is None else f"{BLOCK_PREFIX}{owner}-{secrets.token_hex(4)}"


def _register() -> _Registration | None:
    pid = os.getpid()
    for _ in range(3):
        owner = f"{pid}-{secrets.token_hex(6)}"
        path = _owner_path(owner)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        except OSError as exc:
            _unregistered(path, exc)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a sweep tests this new file
            if _is_linked(path, fd):  # no sweep took it for a dead owner's file in between
                reg = _Registration(owner, pid, fd)
                _write_owner_file(reg)
                atexit.register(_retire, reg)
                return reg
        except OSError as exc:  # a full /dev/shm, no locks there
            os.close(fd)
            path.unlink(missing_ok=True)
            _unregistered(path, exc)
            return None
        os.close(fd)
    return None


def _unregistered(path: Path, exc: OSError) -> None:
    log.warning(
        "cannot create %s (%s): shared-memory blocks of this process cannot be removed by a "
        "later start-up if it is killed",
        path,
        exc.strerror or exc,
    )


def _retire(reg: _Registration) -> None:
    """At a normal exit: remove the owner file (any block still named after it is then an
    orphan for the next sweep, which multiprocessing's tracker also removes at its exit)."""
    if reg.pid != os.getpid() or reg.fd is None:
        return  # a forked child's copy
    _owner_path(reg.owner).unlink(missing_ok=True)
    os.close(reg.fd)
    reg.fd = None


def _is_linked(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _owner_path(owner: str) -> Path:
    return SHM_DIR / f"{OWNER_PREFIX}{owner}"


def _write_owner_file(reg: _Registration) -> None:
    assert reg.fd is not None
    lines = [f"zephon shared-memory owner: pid {reg.pid}", *sorted(reg.semaphores)]
    data = ("\n".join(lines) + "\n").encode()
    os.pwrite(reg.fd, data, 0)
    os.ftruncate(reg.fd, len(data))


def mapped_semaphores() -> set[str]:
    """Names (``sem.mp-...``) of the multiprocessing semaphores this process has mapped now;
    empty where ``/proc/self/maps`` does not exist. The creator maps a semaphore under the
    temporary name glibc links to the final one, so names are matched by inode."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return set()
    prefix = f"{SHM_DIR}/sem."
    inodes = set()
    for line in lines:
        parts = line.rstrip("\n").split(None, 5)
        if len(parts) == 6 and parts[5].startswith(prefix):
            inodes.add(int(parts[4]))
    if not inodes:
        return set()
    found = set()
    for name in _listdir():
        if _SEMAPHORE_RE.fullmatch(name):
            try:
                if os.stat(SHM_DIR / name).st_ino in inodes:
                    found.add(name)
            except OSError:
                continue
    return found


def _listdir() -> list[str]:
    try:
        return os.listdir(SHM_DIR)
    except OSError:
        return []


def record_semaphores(names: set[str]) -> None:
    """List ``names`` (semaphores this process made for its pools) in its owner file, so a
    sweep after its death removes them; names that no longer exist are dropped."""
    with _lock:
        reg = _registration
        if not names or reg is None or reg.fd is None or reg.pid != os.getpid():
            return
        reg.semaphores = {n for n in reg.semaphores if (SHM_DIR / n).exists()} | names
        try:
            _write_owner_file(reg)
        except OSError as exc:  # a full /dev/shm: the tracker still unlinks them at its exit
            log.warning("cannot list semaphores in %s: %s", _owner_path(reg.owner), exc)


def sweep_stale() -> int:
    """Remove the blocks, listed semaphores and owner files of owners that died; returns how
    many entries were removed. Never touches a live owner's."""
    with _lock:
        reg = _registration
        return _sweep(own=reg.owner if reg else None)


def _sweep(own: str | None) -> int:
    names = _listdir() if fcntl is not None else []
    blocks: dict[str, list[str]] = {}
    owners: set[str] = set()
    for name in names:
        if m := _BLOCK_RE.fullmatch(name):
            blocks.setdefault(m.group(1), []).append(name)
        elif m := _OWNER_RE.fullmatch(name):
            owners.add(m.group(1))
    counts = [0, 0, 0]  # blocks, semaphores, owner files
    for owner in sorted((owners | set(blocks)) - {own}):
        for i, n in enumerate(_sweep_owner(owner, blocks.get(owner, []))):
            counts[i] += n
    if any(counts):
        log.info(
            "removed %d shared-memory block(s), %d semaphore(s) and %d owner file(s) left "
            "in %s by processes that died",
            *counts,
            SHM_DIR,
        )
    return sum(counts)


def _sweep_owner(owner: str, blocks: list[str]) -> tuple[int, int, int]:
    """Remove a dead ``owner``'s entries; nothing when it lives or cannot be judged."""
    path = _owner_path(owner)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        # The owner removes its file only when it exits; blocks without one are orphans.
        return sum(_unlink(b) for b in blocks), 0, 0
    except OSError:
        return 0, 0, 0  # another user's: not ours to judge
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                log.debug("cannot test owner file %s: %s", path, exc)
            return 0, 0, 0  # locked: the owner lives
        semaphores = _listed_semaphores(fd)
        removed = (
            sum(_unlink(b) for b in blocks),
            sum(_unlink(s) for s in semaphores),
            _unlink(path.name),
        )
    finally:
        os.close(fd)
    return removed


def _listed_semaphores(fd: int) -> list[str]:
    """The semaphore names in an owner file: whole lines only (after the header line), so a
    write cut short by the owner's death never yields a shorter, someone else's, name."""
    lines = os.pread(fd, 1 << 16, 0).decode(errors="replace").split("\n")[1:-1]
    return [line for line in lines if _SEMAPHORE_RE.fullmatch(line)]


def _unlink(name: str) -> int:
    try:
        (SHM_DIR / name).unlink()
    except OSError:
        return 0
    return 1
