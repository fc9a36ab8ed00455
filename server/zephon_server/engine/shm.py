"""Shared-memory payload handles for the processes runner.

A process worker writes the arrays of a micro-batch's results into one shared-memory block
and replaces each array in the payloads by a :class:`ShmHandle`. The handle is *lazy*: the
main process resolves it (copies the array out) only where the payload is read, that is
before a ``reads_payload=True`` accumulator and before ``process_many`` on a thread worker.
Touching a handle as if it were an array raises a :class:`ContractError` that names the fix.

The main process owns every block: it counts the handles of a block when the result arrives
(:func:`register_results`), unlinks the block once they are all resolved, and unlinks any
remaining block when the runner closes (:func:`release_all`). If it dies first, two things
remove its blocks: multiprocessing's resource tracker (shared by the main process and its
workers, all of which register the blocks they make or map) unlinks every registered block
still there once the last of them has exited; and a block left even so (the tracker killed
too) names its owner (:mod:`.shm_owner`), so the next start-up on the host removes it.
"""

from __future__ import annotations

import math
import threading
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from . import shm_owner
from .errors import ContractError
from .records import SampleRecord

#: Results whose arrays total fewer bytes travel by pickle instead (not worth a block).
MIN_SHM_BYTES = 16 * 1024


class ShmHandle:
    """A lazy reference to an array stored in a shared-memory block."""

    __slots__ = ("block", "dtype", "offset", "shape")

    def __init__(self, block: str, offset: int, dtype: str, shape: tuple[int, ...]) -> None:
        _saw_handles()
        self.block = block
        self.offset = offset
        self.dtype = dtype
        self.shape = shape

    def __getstate__(self) -> tuple[str, int, str, tuple[int, ...]]:
        return (self.block, self.offset, self.dtype, self.shape)

    def __setstate__(self, state: tuple[str, int, str, tuple[int, ...]]) -> None:
        _saw_handles()  # unpickled: a worker's result arriving in the main process
        self.block, self.offset, self.dtype, self.shape = state

    def _misuse(self, *_: Any, **__: Any) -> Any:
        raise ContractError(
            "payload field is an unresolved shared-memory handle (processes runner); an "
            "accumulator that inspects payloads must set reads_payload = True so the runner "
            "resolves them first"
        )

    __len__ = __array__ = __getitem__ = __iter__ = _misuse  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShmHandle({self.block}+{self.offset}, {self.dtype}{list(self.shape)})"


_lock = threading.Lock()
_handles = False  # whether this process ever made or received a handle


def _saw_handles() -> None:
    global _handles
    _handles = True


_attached: dict[str, shared_memory.SharedMemory] = {}
_pending: dict[str, int] = {}  # main process: block -> unresolved handle count


def _untrack(shm: shared_memory.SharedMemory) -> None:
    # A block closed without unlinking (still in use elsewhere) must not be unlinked by the
    # tracker when this process's group exits.
    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:  # pragma: no cover - tracker differences across versions
        pass


def export_results(results: list[Any]) -> list[Any]:
    """Worker side: move the arrays of ``results`` into one block, leaving handles."""
    arrays = [
        (i, k, v)
        for i, rec in enumerate(results)
        if type(rec) is SampleRecord and isinstance(rec.payload, dict)
        for k, v in rec.payload.items()
        if isinstance(v, np.ndarray)
    ]
    total = sum(v.nbytes for _, _, v in arrays)
    if total < MIN_SHM_BYTES:
        return results
    shm = _create_block(total)
    buf = np.ndarray((total,), dtype=np.uint8, buffer=shm.buf)
    offset = 0
    payloads: dict[int, dict[str, Any]] = {}
    for i, key, arr in arrays:
        arr = np.ascontiguousarray(arr)
        n = arr.nbytes
        buf[offset : offset + n] = arr.reshape(-1).view(np.uint8)
        payloads.setdefault(i, dict(results[i].payload))[key] = ShmHandle(
            shm.name, offset, arr.dtype.str, tuple(arr.shape)
        )
        offset += n
    del buf
    shm.close()
    out = list(results)
    for i, payload in payloads.items():
        out[i] = SampleRecord(payload, results[i].meta)
    return out


def _create_block(size: int) -> shared_memory.SharedMemory:
    """A new block named after this process's owner. It stays registered with the resource
    tracker, which unlinks it if the owner dies before it does."""
    while True:
        name = shm_owner.block_name()
        try:
            return shared_memory.SharedMemory(name=name, create=True, size=size)
        except FileExistsError:
            if name is None:
                raise
            continue  # 32 random bits collided: take another


def register_results(results: list[Any]) -> None:
    """Main process: count the handles each block has, so it can be unlinked when resolved."""
    with _lock:
        for rec in results:
            if type(rec) is SampleRecord and isinstance(rec.payload, dict):
                for v in rec.payload.values():
                    if type(v) is ShmHandle:
                        _pending[v.block] = _pending.get(v.block, 0) + 1


def discard_results(results: list[Any]) -> None:
    """Main process: unlink the blocks of results no one will resolve (a result the runner
    could not take in), whether :func:`register_results` counted them or not."""
    names = {
        v.block
        for rec in results
        if type(rec) is SampleRecord and isinstance(rec.payload, dict)
        for v in rec.payload.values()
        if type(v) is ShmHandle
    }
    with _lock:
        for name in names:
            _pending.pop(name, None)
            _close(name, unlink=True)


def _attach(name: str) -> shared_memory.SharedMemory:
    shm = _attached.get(name)
    if shm is None:
        # Attaching registers the block with the (shared) resource tracker; unlink unregisters.
        shm = shared_memory.SharedMemory(name=name)
        _attached[name] = shm
    return shm


def resolve(handle: ShmHandle) -> np.ndarray:
    """Copy the array out of its block; unlink the block after its last handle."""
    holder = {"array": handle}
    _resolve_all([(holder, "array", handle)])
    return holder["array"]  # type: ignore[return-value]


def _resolve_all(found: list[tuple[dict[str, Any], str, ShmHandle]]) -> None:
    """Replace each ``payload[key]`` handle by a copy of its array, under one lock, with one
    byte view per block; unlink each block after its last handle (views dropped first: a
    block with exported views cannot close)."""
    finished: list[str] = []
    with _lock:
        views: dict[str, np.ndarray] = {}
        for payload, key, handle in found:
            name = handle.block
            view = views.get(name)
            if view is None:
                view = views[name] = np.frombuffer(_attach(name).buf, dtype=np.uint8)  # type: ignore[arg-type]
            dtype = np.dtype(handle.dtype)
            start = handle.offset
            end = start + math.prod(handle.shape) * dtype.itemsize
            payload[key] = view[start:end].view(dtype).reshape(handle.shape).copy()
            left = _pending.get(name)
            if left is not None:
                if left <= 1:
                    del _pending[name]
                    finished.append(name)
                else:
                    _pending[name] = left - 1
        views.clear()
        view = None  # the last one too
        for name in finished:
            _close(name, unlink=True)


def _close(name: str, *, unlink: bool) -> None:
    shm = _attached.pop(name, None)
    if shm is None:
        try:
            shm = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            return
    shm.close()
    if unlink:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass
    else:
        _untrack(shm)


def resolve_payloads(elems: list[Any]) -> list[Any]:
    """Replace every handle in the elements' payloads by its array (in place, cheap if none).

    A process that never made or received a handle (every process but the processes runner's)
    has none to look for: the elements are returned without a scan."""
    if not _handles:
        return elems
    found = [
        (payload, k, v)
        for rec in elems
        if type(rec) is SampleRecord and type(payload := rec.payload) is dict
        for k, v in payload.items()
        if type(v) is ShmHandle
    ]
    if found:
        _resolve_all(found)
    return elems


def release_all() -> int:
    """Unlink every block still owned by this process (runner shutdown); returns the count."""
    with _lock:
        names = set(_pending) | set(_attached)
        for name in names:
            _close(name, unlink=name in _pending)
        _pending.clear()
        return len(names)


def live_blocks() -> int:
    """Blocks with unresolved handles (for tests and metrics)."""
    with _lock:
        return len(_pending)
