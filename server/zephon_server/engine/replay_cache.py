"""The replay cache: tokenizer output kept on disk so a resume does not tokenize again.

A resumed lane is regenerated from its last epoch boundary (DESIGN.md §6), which means reading,
tokenizing, packing and shuffling up to ``flush_every_k_chunks`` chunks again only for the
replay filter to drop most of it. Tokenizing is nearly all of that cost. With a replay cache
the ``tokenize`` operator writes what it produced, per lane and chunk, into a directory; when
a later run replays those chunks it reads the token ids back instead of encoding the text.

The cache never decides what the data is, only how fast it is rebuilt:

* it lives under the plan's fingerprint (datasets, operator configs, tokenizer identity,
  seed, lanes, chunking), so a different pipeline never reads it;
* entries are keyed by the record's cursor, which is unique within a lane, and only read for
  the chunks a resumed lane replays (from its epoch boundary to the end of that epoch: the
  shuffle may emit the replay cursor's row only several chunks after the row's own chunk);
* every file carries a CRC-32 of its contents and appears atomically (written to a temporary
  name, then renamed); a missing, partial or corrupt file is a miss, and a miss encodes the
  text exactly as without a cache.

Layout: ``<root>/<fingerprint[:16]>/lane-<L>/chunk-<C>/op<I>-<first cursor>.tok``. The run
that owns the cache drops a lane's chunk directories once they are ``keep_epochs`` epochs
before the epoch of the oldest position a checkpoint may still be taken at (the slowest
consumer's, :meth:`ReplayCache.on_chunk`), so the cache holds about ``keep_epochs`` epochs per
lane plus those the source runs ahead (with the bench's geometry, 8 chunks of 1024
documents, ~3 MB of tokens per chunk).

The cache is bounded by a :class:`~.cache_budget.CacheBudget` (``--replay-cache-max-bytes``),
enforced as it writes, under the byte ledger every writing process shares: an entry that would
exceed the budget first evicts other pipelines' directories, then this pipeline's oldest chunks
of any lane (older than the entry's own chunk), down to 90% of the budget; an entry that still
does not fit, or that would leave less than the budget's reserve free on the filesystem, is not
written. A full disk (``ENOSPC``) pauses writing in that process (30 s, doubling up to 10 min
while it stays full), with one warning per pause. Nothing here ever raises into the pipeline:
the cache is an optimisation, and a miss re-tokenizes.

File format: ``ZRC1``, a little-endian u32 header length, a JSON header (``cursors``,
``lengths``, ``dtype``, ``crc``) and the concatenated token ids (``uint16`` when every id
fits, else ``int32``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cache_budget import LEDGER_NAME, CacheBudget, CacheLedger, LedgerCounts, tree_usage
from .records import Cursor

log = logging.getLogger(__name__)

MAGIC = b"ZRC1"
_HEADER_LEN = struct.Struct("<I")
#: Extras key under which a run hands the cache and the replayed chunks to the operators.
REPLAY_CACHE = "replay_cache"
#: Chunk indexes a process keeps loaded for lookups (a resume reads each chunk once).
_INDEX_SLOTS = 16
#: Seconds a process stops writing after a full disk; doubled while it stays full, up to
#: ``_PAUSE_MAX``; back to the start after a write succeeds.
_PAUSE = 30.0
_PAUSE_MAX = 600.0
#: Eviction for an entry that does not fit frees space down to this share of the budget, so
#: a cache at its budget does not list its directories on every write.
_LOW_WATER = 0.9
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _cursor_name(cursor: Cursor) -> str:
    return "_".join(str(int(c)) for c in cursor)


class ReplayCache:
    """A directory of cached tokenizer output for one pipeline (picklable: a path and knobs).

    ``replay_ends`` maps a resumed lane to the end (exclusive) of its replayed chunks; only
    those lanes' chunks below it are looked up (set by the run; empty for a fresh start, which
    only writes). Counters (``hits``, ``misses``, ``stored``) count in the process that
    tokenizes; the bytes in use and the skipped writes are in the shared ledger
    (:meth:`usage`). ``budget``: default :meth:`CacheBudget.for_path` of ``root``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fingerprint: str = "",
        keep_epochs: int = 2,
        replay_ends: dict[int, int] | None = None,
        budget: CacheBudget | None = None,
    ) -> None:
        if not isinstance(keep_epochs, int) or keep_epochs < 1:
            raise ValueError(
                f"replay cache: keep_epochs must be an integer >= 1, got {keep_epochs}"
            )
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.keep_epochs = keep_epochs
        self.replay_ends = dict(replay_ends or {})
        self.budget = budget if budget is not None else CacheBudget.for_path(self.root)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._index: OrderedDict[tuple[int, int, int], dict[Cursor, np.ndarray]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.stored = 0
        self.ledger = CacheLedger(self.root)
        self._paused_until = 0.0  # monotonic time before which this process does not write
        self._pause = _PAUSE
        self._low_disk_warned = False

    def __getstate__(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "fingerprint": self.fingerprint,
            "keep_epochs": self.keep_epochs,
            "replay_ends": self.replay_ends,
            "budget": self.budget,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def bind(self, fingerprint: str, replay_ends: dict[int, int] | None = None) -> ReplayCache:
        """A copy for one run of the pipeline with ``fingerprint``, its ledger recounted."""
        cache = ReplayCache(
            self.root,
            fingerprint=fingerprint,
            keep_epochs=self.keep_epochs,
            replay_ends=replay_ends,
            budget=self.budget,
        )
        cache.recount()
        return cache

    def recount(self) -> None:
        """Set the ledger's bytes to what the directory holds, removing temporary files left
        by a killed writer (every writer holds the ledger while its file exists). A run
        starts with this, so a ledger that drifted (a crash, a hand-made deletion) is fixed."""
        try:
            with self.ledger.locked() as counts:
                for stray in self.root.glob("*/lane-*/chunk-*/.*.tmp"):
                    stray.unlink(missing_ok=True)
                counts.bytes = tree_usage(self.root, self.budget, skip=LEDGER_NAME)
        except OSError as exc:
            self._warn_once(f"replay cache: cannot use {self.root}: {exc}")

    def usage(self) -> LedgerCounts | None:
        """The shared ledger now: bytes in use, evicted, skipped writes (None before use)."""
        return self.ledger.snapshot()

    @property
    def directory(self) -> Path:
        """This pipeline's directory (``root/<fingerprint[:16]>``)."""
        return self.root / (self.fingerprint[:16] or "unbound")

    def _chunk_dir(self, lane: int, chunk: int) -> Path:
        return self.directory / f"lane-{lane:04d}" / f"chunk-{chunk:08d}"

    # -- writing (workers) ----------------------------------------------------------------

    def store(self, op_index: int, records: Sequence[Any], ids_list: Sequence[np.ndarray]) -> None:
        """Write the token ids of ``records`` (grouped per lane and chunk) within the budget.
        Never raises: a cache that cannot be written only costs speed, so the error is logged
        once (a full disk: once per pause)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, rec in enumerate(records):
            meta = rec.meta
            groups.setdefault((meta.lane_id, int(meta.cursor[0])), []).append(i)
        for (lane, chunk), idx in groups.items():
            if time.monotonic() < self._paused_until:
                self._count_paused()
                return
            try:
                self._write(
                    op_index,
                    lane,
                    chunk,
                    [records[i].meta.cursor for i in idx],
                    [ids_list[i] for i in idx],
                )
            except OSError as exc:
                self._warn_once(f"replay cache: cannot write under {self.directory}: {exc}")
                return

    def _write(
        self, op_index: int, lane: int, chunk: int, cursors: list[Cursor], arrays: list[np.ndarray]
    ) -> None:
        blob = _encode_entry(cursors, arrays)
        directory = self._chunk_dir(lane, chunk)
        final = directory / f"op{op_index}-{_cursor_name(cursors[0])}.tok"
        size = self.budget.disk_size
        with self.ledger.locked() as counts:
            if not self._room_for(counts, final, len(blob), chunk):
                return
            try:
                counts.bytes += self._make_dirs(directory) * self.budget.block
                replaced = _replace_file(final, blob)
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    raise
                counts.skipped_disk_full += 1
                self._pause_writing(exc)
                return
            counts.bytes += size(len(blob)) - (size(replaced) if replaced is not None else 0)
        self._pause = _PAUSE
        self._low_disk_warned = False
        with self._lock:
            self.stored += len(cursors)

    def _room_for(self, counts: LedgerCounts, final: Path, nbytes: int, chunk: int) -> bool:
        """Whether an entry of ``nbytes`` may be written now (evicting older chunks to make
        room); counts the skip when not. The ledger is held."""
        budget = self.budget
        need = budget.disk_size(nbytes) + self._missing_dirs(final.parent) * budget.block
        if need > budget.max_bytes or (
            counts.bytes + need > budget.max_bytes and not self._evict_for(counts, need, chunk)
        ):
            counts.skipped_budget += 1
            return False
        try:
            fs = os.statvfs(self.root)
        except OSError:
            return True
        free = fs.f_bavail * fs.f_frsize
        if free - need < budget.reserve_bytes:
            counts.skipped_low_disk += 1
            if not self._low_disk_warned:
                self._low_disk_warned = True
                log.warning(
                    "replay cache: %d bytes free on the filesystem of %s; a %d-byte entry "
                    "would leave less than the %d bytes kept free for checkpoints, so the "
                    "cache writes nothing until there is room (resumes re-tokenize what is "
                    "missing)",
                    free,
                    self.root,
                    need,
                    budget.reserve_bytes,
                )
            return False
        return True

    def _evict_for(self, counts: LedgerCounts, need: int, chunk: int) -> bool:
        """Evict until ``need`` more bytes fit (down to the low-water mark): other pipelines'
        directories first, then this pipeline's chunks older than ``chunk``, oldest chunk of
        any lane first. Whether the entry fits afterwards. The ledger is held."""
        target = max(0, int(self.budget.max_bytes * _LOW_WATER) - need)
        for victim in self._eviction_order(chunk):
            self._remove(counts, victim)
            if counts.bytes <= target:
                break
        return counts.bytes + need <= self.budget.max_bytes

    def _eviction_order(self, chunk: int) -> Iterator[Path]:
        mine = self.directory
        try:
            others = sorted(p for p in self.root.iterdir() if p.is_dir() and p != mine)
        except OSError:
            others = []
        yield from others
        chunks: list[tuple[int, str, Path]] = []
        try:
            lane_dirs = [p for p in mine.iterdir() if p.name.startswith("lane-")]
        except OSError:
            lane_dirs = []
        for lane_dir in lane_dirs:
            try:
                names = os.listdir(lane_dir)
            except OSError:
                continue
            for name in names:
                number = _chunk_number(name)
                if number is not None and number < chunk:
                    chunks.append((number, lane_dir.name, lane_dir / name))
        for _, _, path in sorted(chunks):
            yield path

    def _remove(self, counts: LedgerCounts, path: Path) -> None:
        """Delete a directory tree and take its bytes off the ledger (which is held)."""
        freed = self.budget.block + tree_usage(path, self.budget)
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            counts.bytes -= freed
            counts.evicted_bytes += freed

    def _missing_dirs(self, directory: Path) -> int:
        """Directories ``_make_dirs`` would create, up to the cache's root."""
        n = 0
        while directory != self.root and not directory.exists():
            n += 1
            directory = directory.parent
        return n

    def _make_dirs(self, directory: Path) -> int:
        """Create ``directory`` and its missing parents; how many were created."""
        n = self._missing_dirs(directory)
        if n:
            directory.mkdir(parents=True, exist_ok=True)
        return n

    def _pause_writing(self, exc: OSError) -> None:
        log.warning(
            "replay cache: no space left on the filesystem of %s (%s); not writing it for "
            "%.0f s (resumes re-tokenize what is missing; the pipeline is unaffected)",
            self.root,
            exc.strerror or exc,
            self._pause,
        )
        self._paused_until = time.monotonic() + self._pause
        self._pause = min(self._pause * 2, _PAUSE_MAX)

    def _count_paused(self) -> None:
        try:
            with self.ledger.locked() as counts:
                counts.skipped_disk_full += 1
        except OSError:
            pass

    def _warn_once(self, message: str) -> None:
        if not getattr(self, "_warned", False):
            self._warned = True
            log.warning("%s; resumes re-tokenize instead", message)

    # -- reading (workers, on replay) -----------------------------------------------------

    def wants(self, lane: int, chunk: int) -> bool:
        """Whether records of ``lane``'s ``chunk`` are looked up (a replayed chunk)."""
        end = self.replay_ends.get(lane)
        return end is not None and chunk < end

    def lookup(self, op_index: int, records: Sequence[Any]) -> list[np.ndarray | None]:
        """Cached token ids per record (None where not cached or not replayed)."""
        out: list[np.ndarray | None] = []
        hits = 0
        for rec in records:
            meta = rec.meta
            lane, chunk = meta.lane_id, int(meta.cursor[0])
            found = None
            if self.wants(lane, chunk):
                found = self._chunk_index(op_index, lane, chunk).get(tuple(meta.cursor))
            hits += found is not None
            out.append(found)
        with self._lock:
            self.hits += hits
            self.misses += len(records) - hits
        return out

    def _chunk_index(self, op_index: int, lane: int, chunk: int) -> dict[Cursor, np.ndarray]:
        key = (op_index, lane, chunk)
        with self._lock:
            index = self._index.get(key)
            if index is not None:
                self._index.move_to_end(key)
                return index
        index = self._load_chunk(op_index, lane, chunk)
        with self._lock:
            self._index[key] = index
            while len(self._index) > _INDEX_SLOTS:
                self._index.popitem(last=False)
        return index

    def _load_chunk(self, op_index: int, lane: int, chunk: int) -> dict[Cursor, np.ndarray]:
        index: dict[Cursor, np.ndarray] = {}
        directory = self._chunk_dir(lane, chunk)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return index
        prefix = f"op{op_index}-"
        for name in names:
            if not (name.startswith(prefix) and name.endswith(".tok")):
                continue
            path = directory / name
            try:
                entries = _read_file(path)
            except (OSError, ValueError) as exc:
                log.warning("replay cache: ignoring %s (%s); its records are tokenized", path, exc)
                continue
            index.update(entries)
        return index

    # -- eviction (the run's source thread) -----------------------------------------------

    def evict(self, lane: int, before_chunk: int) -> None:
        """Remove ``lane``'s chunk directories below ``before_chunk``."""
        lane_dir = self.directory / f"lane-{lane:04d}"
        try:
            names = os.listdir(lane_dir)
        except OSError:
            return
        old = [n for n in names if (c := _chunk_number(n)) is not None and c < before_chunk]
        if not old:
            return
        try:
            with self.ledger.locked() as counts:
                for name in old:
                    self._remove(counts, lane_dir / name)
        except OSError:  # no ledger (e.g. its directory is gone): still free the disk
            for name in old:
                shutil.rmtree(lane_dir / name, ignore_errors=True)

    def on_chunk(self, lane: int, chunk: int, k: int, floor: int | None = None) -> None:
        """Called as the source starts ``lane``'s ``chunk``: at an epoch start, evict the
        chunks more than ``keep_epochs`` epochs before ``floor``, the epoch boundary of the
        oldest position a checkpoint of the lane may still be taken at (default: ``chunk``).
        A source running far ahead of its consumers therefore never evicts the epochs a
        checkpoint at their position replays."""
        floor = chunk if floor is None else min(floor, chunk)
        if k and chunk % k == 0 and floor >= self.keep_epochs * k:
            self.evict(lane, floor - self.keep_epochs * k)


def _chunk_number(name: str) -> int | None:
    """The chunk of a ``chunk-<C>`` directory name, else None."""
    if not name.startswith("chunk-"):
        return None
    try:
        return int(name[6:])
    except ValueError:
        return None


def _replace_file(final: Path, data: bytes) -> int | None:
    """Make ``final`` hold ``data`` atomically (temporary file, rename); the size of the file
    it replaced, or None. A failed write leaves no temporary file."""
    replaced = final.stat().st_size if final.exists() else None
    tmp = final.parent / f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return replaced


def _encode_entry(cursors: list[Cursor], arrays: list[np.ndarray]) -> bytes:
    """One cache file's bytes: magic, header length, JSON header, token ids."""
    lengths = [len(a) for a in arrays]
    data = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    dtype = "uint16" if data.size == 0 or (data.min() >= 0 and data.max() < 65536) else "int32"
    body = data.astype(dtype, copy=False).tobytes()
    header = json.dumps(
        {
            "cursors": [list(c) for c in cursors],
            "lengths": lengths,
            "dtype": dtype,
            "crc": zlib.crc32(body),
        },
        separators=(",", ":"),
    ).encode()
    return MAGIC + _HEADER_LEN.pack(len(header)) + header + body


def _read_file(path: Path) -> dict[Cursor, np.ndarray]:
    raw = path.read_bytes()
    if raw[:4] != MAGIC or len(raw) < 8:
        raise ValueError("not a replay cache file")
    (hlen,) = _HEADER_LEN.unpack_from(raw, 4)
    header = json.loads(raw[8 : 8 + hlen])
    body = memoryview(raw)[8 + hlen :]
    if zlib.crc32(body) != header["crc"]:
        raise ValueError("checksum mismatch")
    data = np.frombuffer(body, dtype=header["dtype"])
    lengths = header["lengths"]
    cursors = header["cursors"]
    if len(lengths) != len(cursors) or sum(lengths) != data.size:
        raise ValueError("header does not match the data")
    out: dict[Cursor, np.ndarray] = {}
    start = 0
    for cursor, n in zip(cursors, lengths):
        out[tuple(cursor)] = data[start : start + n].astype(np.int32)
        start += n
    return out
