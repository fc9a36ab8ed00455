"""Shared-memory rings: a stream's tensor bytes through ``/dev/shm`` for a client on the host.

Moving a 214 KB batch through loopback gRPC costs more CPU than anything else in delivery:
the server copies the message into gRPC's buffers and the kernel's, the client copies it out of
the kernel's, out of gRPC's and out of protobuf's (``python -m bench.delivery``). A client that
asks (``OpenLane.shared_memory``) is offered a ring file per stream; if it can map the file and
finds the nonce the server wrote at its start, it is on the same host and says so
(``RingReply``). From then on the server writes each message's tensor bytes into the ring
(one copy) and sends only their offsets (``Tensor.ring_offset``); the client copies them out
(one copy) before it hands the batch on. Until the reply, when the client declines, or when the
ring has no room (unacknowledged batches still occupy it), bytes travel in the message as
before: the data never depends on which way they went, and the client's digest check covers
both.

A message's region is reused once the client acknowledged all its batches (it copies bytes out
on receipt, before the consumer can acknowledge). The file is unlinked as soon as the client
answered (or at the end of the stream), so nothing is left in ``/dev/shm`` once both sides
have it mapped; files of a server that died in between are removed by the next server on the
host (:func:`sweep_stale`). The file is created with mode 0600: only the server's user can map
it, which is also who can read the server's memory anyway.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zephon_wire import RING_DIR, RING_NONCE_SIZE, RING_PREFIX

from ..engine.numbered_batch import NumberedBatch

log = logging.getLogger(__name__)

SHM_DIR = Path(RING_DIR)
PREFIX = RING_PREFIX
NONCE_SIZE = RING_NONCE_SIZE
MIN_SIZE = 1 << 20
DEFAULT_MAX_MIB = 64
"""``--shm-ring-mib``: the largest ring a stream gets (0 turns rings off)."""


class RingSpace:
    """Where the next message's bytes go in a ring of ``size`` bytes (no I/O, one thread).

    Regions are handed out in order, each contiguous, after the newest one or wrapped to the
    start; a region is freed once every batch it holds was acknowledged (:meth:`release`).
    """

    def __init__(self, size: int, start: int = 0) -> None:
        self.size = size
        self.start = start  # the first usable byte (the nonce sits before it)
        self._regions: collections.deque[tuple[int, int, int]] = collections.deque()

    def allocate(self, nbytes: int, end_seq: int) -> int | None:
        """The offset of ``nbytes`` free bytes, held until the client acknowledges seq
        ``end_seq - 1``; ``None`` when no free stretch is that long."""
        if nbytes <= 0 or nbytes > self.size - self.start:
            return None
        if not self._regions:
            offset = self.start
        else:
            tail = self._regions[0][1]  # the oldest region's start
            head = self._regions[-1][2]  # the newest region's end
            if head > tail:  # free: [head, size) and [start, tail)
                if head + nbytes <= self.size:
                    offset = head
                elif self.start + nbytes <= tail:
                    offset = self.start
                else:
                    return None
            elif head + nbytes <= tail:  # wrapped: free is [head, tail)
                offset = head
            else:
                return None
        self._regions.append((end_seq, offset, offset + nbytes))
        return offset

    def release(self, acknowledged: int) -> None:
        """Free the regions whose batches all have seq < ``acknowledged``."""
        while self._regions and self._regions[0][0] <= acknowledged:
            self._regions.popleft()

    @property
    def in_use(self) -> int:
        """Bytes held by unacknowledged messages."""
        return sum(end - start for _, start, end in self._regions)


class Ring:
    """One stream's ring file, mapped by the server. Made by :meth:`create`."""

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        self.size = size
        self.nonce = secrets.token_bytes(NONCE_SIZE)
        self._fd = fd
        self._map = mmap.mmap(fd, size)
        self._map[:NONCE_SIZE] = self.nonce
        self._space = RingSpace(size, NONCE_SIZE)
        self._lock = threading.Lock()
        self._linked = True
        self._mapped = True
        self._closed = False
        self.accepted = False
        self.answered = False

    @classmethod
    def create(cls, lane: int, size: int) -> Ring | None:
        """A ring of ``size`` bytes (page-rounded) for a stream of ``lane``, or ``None`` when
        this host cannot make one (no ``/dev/shm``, or not enough room in it: logged)."""
        size = -(-max(size, MIN_SIZE) // mmap.PAGESIZE) * mmap.PAGESIZE
        room = _room(size)
        if room:
            log.info("no shared-memory ring for lane %d (%s); batches go in messages", lane, room)
            return None
        path = SHM_DIR / f"{PREFIX}{os.getpid()}-{lane}-{secrets.token_hex(6)}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            log.info("no shared-memory ring for lane %d (%s); batches go in messages", lane, exc)
            return None
        try:
            # Reserve the pages now: writing to a file that tmpfs cannot back would kill the
            # server with SIGBUS instead of failing here.
            os.posix_fallocate(fd, 0, size)
            return cls(path, fd, size)
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            log.warning(
                "no shared-memory ring of %d MiB for lane %d (%s: /dev/shm too small?); batches "
                "go in messages. Give the container more (docker run --shm-size) or lower "
                "--shm-ring-mib",
                size >> 20,
                lane,
                exc,
            )
            return None

    def answer(self, accepted: bool, reason: str = "") -> None:
        """The client's reply to the offer (from the stream's request reader): use the ring,
        or give its memory back at once (:meth:`place` never touches a ring that was not
        accepted)."""
        with self._lock:
            self.answered = True
            self.accepted = accepted and not self._closed
            self._unlink()
            if not self.accepted:
                self._unmap()
        if not accepted:
            # repr: the client's text, newlines and all, cannot pass for lines of the log
            log.info("client declined the shared-memory ring: %r", reason or "no reason")

    def place(
        self, batches: Sequence[NumberedBatch], acknowledged: int
    ) -> list[dict[str, int]] | None:
        """Copy the tensors of ``batches`` into the ring; each batch's offsets by tensor name,
        or ``None`` (nothing written) when the client has not accepted the ring or it has no
        room. ``acknowledged``: the client's acknowledged position (frees older regions)."""
        if not self.accepted:
            return None
        self._space.release(acknowledged)
        total = sum(b.nbytes for b in batches)
        offset = self._space.allocate(total, batches[-1].seq + 1)
        if offset is None:
            return None
        out: list[dict[str, int]] = []
        for tensors in (b.wire for b in batches):
            offsets = {}
            for name, arr in tensors:
                offsets[name] = offset
                if arr.nbytes:
                    self._map[offset : offset + arr.nbytes] = arr.reshape(-1).view(np.uint8).data
                offset += arr.nbytes
            out.append(offsets)
        return out

    def close(self) -> None:
        """Unlink (if still linked) and unmap; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.accepted = False
            self._unlink()
            self._unmap()

    def _unlink(self) -> None:
        if self._linked:
            self._linked = False
            self.path.unlink(missing_ok=True)

    def _unmap(self) -> None:
        if self._mapped:
            self._mapped = False
            self._map.close()
            os.close(self._fd)


def _room(size: int) -> str:
    """Why ``/dev/shm`` should not take a ring of ``size`` bytes (empty: it can). Rings leave
    at least half of it free for everything else there (the processes runner's payload blocks
    among them), so a container's small ``/dev/shm`` (Docker: 64 MB) gives rings to some
    streams rather than to none of the other users."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError as exc:
        return f"{SHM_DIR}: {exc.strerror or exc}"
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    if free - size < total // 2:
        return (
            f"{SHM_DIR} has {free >> 20} MiB free of {total >> 20} MiB and rings leave half of "
            "it to others; give it more room (docker run --shm-size) or lower --shm-ring-mib"
        )
    return ""


def ring_size(batch_bytes: int, batches_in_flight: int, max_mib: int) -> int:
    """A ring that holds ``batches_in_flight`` batches of ``batch_bytes``, at most
    ``max_mib`` MiB."""
    return min(batch_bytes * batches_in_flight + NONCE_SIZE, max_mib << 20)


def sweep_stale() -> int:
    """Remove ring files whose server process is gone (it died between making a ring and the
    client's reply); returns how many."""
    removed = 0
    try:
        paths = list(SHM_DIR.glob(f"{PREFIX}*"))
    except OSError:
        return 0
    for path in paths:
        try:
            pid = int(path.name[len(PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    if removed:
        log.info("removed %d shared-memory ring file(s) left by servers that died", removed)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
