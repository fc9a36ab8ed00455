"""Line indexes of JSONL content: the start offset of every row, in one pass over the bytes.

A row is every ``\\n``-terminated line plus a final unterminated non-empty line. The scans
reuse their buffers (see :class:`_Scratch`), so indexing allocates only the offsets it returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np

_BLOCK = 1 << 20  # bytes read and scanned per step while indexing (buffers reused: _Scratch)


def line_starts(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Row boundaries of an in-memory JSONL buffer (see :func:`index_lines`)."""
    view = memoryview(data).cast("B")
    pieces = [np.zeros(1, dtype=np.int64), newline_starts(view)]
    last = view[-1] if len(view) else 10
    return _finish_starts(pieces, len(view), last)


def newline_starts(data: bytes | bytearray | memoryview, offset: int = 0) -> np.ndarray:
    """``offset`` + 1 + the position of every ``\\n`` in ``data``: the row starts the
    newlines of a piece of JSONL at ``offset`` make (``int64``, ascending)."""
    view = memoryview(data).cast("B")
    with _scratch() as scratch:
        step = len(scratch.mask)
        starts = range(0, len(view), step)
        blocks = [np.frombuffer(view[start : start + step], dtype=np.uint8) for start in starts]
        pieces = [scratch.newlines(block, offset + start) for block, start in zip(blocks, starts)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def index_lines(path: str) -> np.ndarray:
    """Build the line index of a plain JSONL file in one buffered pass.

    Returns ``starts`` with ``len(starts) == rows + 1``: row ``i`` is the bytes
    ``[starts[i], starts[i + 1] - 1)`` (the newline excluded). A final unterminated line gets
    a virtual newline at ``size``, so the same formula holds. Raises ``OSError``.

    Reads of :data:`_BLOCK` bytes, each scanned before the next one, on the calling thread:
    on a cold file this kept up with plain reads of the same size (the kernel's read-ahead
    overlaps the scan), while a read-ahead thread, or larger blocks, lost 5-30%
    (``docs/decisions.md``, "Indexing reads: 1 MiB, one thread" and "Read buffers on a page
    boundary"). The read buffer and the newline mask are reused across blocks and calls
    (see :class:`_Scratch`): the only arrays allocated per call are the row offsets themselves.
    """
    pieces = [np.zeros(1, dtype=np.int64)]
    pos = 0
    last = 10
    with open(path, "rb", buffering=0) as fh, _scratch() as scratch:
        while n := fh.readinto(scratch.data.data):
            block = scratch.data[:n]
            pieces.append(scratch.newlines(block, pos))
            last = int(block[-1])
            pos += n
    return _finish_starts(pieces, pos, last)


class _Scratch:
    """The buffers one line scan reuses for every block: the bytes read and the newline mask,
    each on a page boundary (:func:`_aligned`).

    Allocating them per shard was the start-up's allocator trap: a ``bytearray(16 MiB)`` is
    16 MiB + 1 byte, above mimalloc 2.0's largest "large" object, so every shard got a fresh
    mapping from the kernel (a page fault per 4 KiB, zeroed) that was unmapped again on free,
    while glibc kept it on its heap (``docs/decisions.md``, "Start-up under mimalloc"). Up to
    :data:`_SCRATCH_KEPT` of them are kept for the next scans; pages are committed only as
    blocks touch them, so indexing small shards keeps only their size resident.
    """

    def __init__(self, size: int) -> None:
        self.mask = _aligned(size).view(np.bool_)
        self.words = np.empty(size // _WORD, dtype=np.bool_)
        self._data: np.ndarray | None = None

    @property
    def data(self) -> np.ndarray:
        """The read buffer, allocated on first use (scans of bytes in memory need none)."""
        if self._data is None:
            self._data = _aligned(len(self.mask))
        return self._data

    def newlines(self, block: np.ndarray, offset: int) -> np.ndarray:
        """``offset`` + 1 + the position of every ``\\n`` in ``block``: the row starts it
        ends (``int64``).

        The newline mask is searched a 64-bit word at a time: ``np.equal`` and
        ``np.not_equal`` release the GIL, and ``np.flatnonzero`` (which holds it) then walks
        an eighth of the elements; only the words holding a newline are expanded to byte
        positions. That is faster than one ``np.flatnonzero`` over the bytes and holds the GIL
        for a fraction of the time (measured in ``docs/decisions.md``, "The newline scan by
        words"). Dense blocks (a newline in more than a quarter of the words) take the plain
        byte search, which is then cheaper.
        """
        n = len(block)
        mask = self.mask[:n]
        np.equal(block, 10, out=mask)
        whole = n - n % _WORD
        words = self.words[: whole // _WORD]
        np.not_equal(mask[:whole].view(np.uint64), 0, out=words)
        hit = np.flatnonzero(words)
        if len(hit) * 4 > len(words):
            found = np.flatnonzero(mask)
        else:
            # the bytes of the words found, as one flat run: byte k of it is byte k % 8 of
            # word hit[k // 8] (in place, fewer calls: 25 against 40 µs per MiB, 2026-12-08)
            within = np.flatnonzero(mask[:whole].reshape(-1, _WORD)[hit])
            found = hit[within // _WORD]
            found *= _WORD
            found += within % _WORD
            if whole < n:
                found = np.concatenate([found, np.flatnonzero(mask[whole:]) + whole])
        found = found.astype(np.int64, copy=False)  # intp: int64 on every 64-bit platform
        np.add(found, offset + 1, out=found)
        return found


def _aligned(size: int) -> np.ndarray:
    """``size`` bytes starting on a page boundary. A read into a buffer that starts 8 or 16
    bytes past a cache line took the kernel 4-5 times as long on this benchmark machine's AMD
    EPYC (about 600 against 130 µs per MiB from the page cache), and a large ``np.empty``
    starts 16 bytes into a page under glibc (``docs/decisions.md``, "Read buffers on a page
    boundary")."""
    raw = np.empty(size + _PAGE, dtype=np.uint8)
    skip = -raw.ctypes.data % _PAGE
    return raw[skip : skip + size]


_PAGE = 4096
_WORD = 8  # bytes of the mask searched at once (a uint64 view)
_SCRATCH_KEPT = 4  # buffers kept for reuse (one per concurrent scan); more are allocated
_scratch_pool: list[_Scratch] = []
_scratch_lock = threading.Lock()


@contextlib.contextmanager
def _scratch() -> Iterator[_Scratch]:
    """A :class:`_Scratch` from the pool (or a new one), returned to the pool afterwards."""
    with _scratch_lock:
        scratch = _scratch_pool.pop() if _scratch_pool else None
    if scratch is None or len(scratch.mask) != _BLOCK:  # (tests change _BLOCK)
        scratch = _Scratch(_BLOCK)
    try:
        yield scratch
    finally:
        with _scratch_lock:
            if len(_scratch_pool) < _SCRATCH_KEPT:
                _scratch_pool.append(scratch)


def _finish_starts(pieces: list[np.ndarray], size: int, last: int) -> np.ndarray:
    if size and last != 10:
        pieces.append(np.array([size + 1], dtype=np.int64))
    return np.concatenate(pieces)
