"""The work source: datasets + seed → a deterministic sequence of chunks of document pointers.

No I/O happens here; only the datasets' row counts, weights and exhaustion policies matter.

**Mixture.** Sample slots are assigned to datasets one at a time by smooth weighted round-robin
(SWRR, the nginx algorithm) over the *active* datasets, with integer weights
``round(weight * 1_000_000)``: every active dataset adds its weight to its *current* value, the
largest current wins (ties go to the lowest dataset index) and pays back the sum of the active
weights (see :mod:`.swrr`). While the active set is unchanged, each dataset's sample count
stays within about one sample of its exact share ``weight / sum(active weights)``, so shares
are exact in the long run.

**Exhaustion.** A dataset pass visits every row of the dataset exactly once. When a dataset
has produced its last row of a pass:

* ``stop``: it leaves the mixture (inactive, its SWRR current is dropped to 0); the others go
  on with their own weights.
* ``repeat``: it starts pass ``p + 1`` with a fresh order and stays in the mixture.

The stream ends when no dataset is active, so it is finite iff every dataset uses ``stop``
(then it holds every row of every dataset exactly once). A chunk in which the last active
dataset runs out is cut short and is the last chunk.

**Order within a pass.** Pass ``p`` of dataset ``d`` visits its shards in a keyed permutation
(key ``(seed, d, p)``) and the rows of each shard in a keyed permutation (key
``(seed, d, p, shard)``); the k-th sample of the pass maps to a (shard, row) through the
cumulative row counts of the permuted shards. Consecutive samples of a dataset therefore come
from the same shard, which keeps compressed shards hot in the shard cache. A row order is never
stored: the rows of a run of samples are evaluated from the permutation when needed.

**Lanes.** Chunk ``g`` belongs to block ``b = g // lanes``; a keyed permutation of the lanes
(key ``(seed, b)``) gives ``lane_of(g) = perm_b[g % lanes]``. Each lane gets exactly one
chunk per block and its lane-local chunk id is ``b``.

**State.** The source is sequential: the plain-data state at chunk ``g`` (pass, rows consumed,
active flag and SWRR current per dataset) determines chunk ``g`` and everything after it. Its
size does not depend on the chunk size. Every value here is a pure function of (row counts,
weights, exhaustion policies, seed, lanes, chunk_size); randomness comes from the project's own
keyed permutation (:mod:`.permutation`: a Feistel network keyed by BLAKE2b of the key tuple,
each key prefixed with a domain tag for shards, rows or lanes), specified independently of numpy
and identical on every platform and numpy version.
"""

from __future__ import annotations

import bisect
import logging
import numbers
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

import numpy as np

from .datasets import DatasetInfo
from .errors import ConfigError
from .permutation import Permutation
from .records import DocRef
from .swrr import Swrr

logger = logging.getLogger(__name__)

#: 2: the orders come from :mod:`.permutation` (1: numpy ``PCG64`` permutations).
STATE_VERSION = 2
WEIGHT_SCALE = 1_000_000
SNAPSHOT_EVERY = 64
MAX_SNAPSHOTS = 4096

# Domain tags keep the permutation keys of different uses apart.
_TAG_SHARDS = 0x5A5348
_TAG_ROWS = 0x5A524F
_TAG_LANES = 0x5A4C41

_LAYOUT_CACHE = 64
_ROW_PERM_CACHE = 64  # Permutation objects (each at most ~256 KiB of round tables)
_LANE_PERM_CACHE = 256


@dataclass(frozen=True, eq=False)
class Chunk:
    """A group of document pointers: ``docs[i] = (dataset, shard, row, pass)`` (int64)."""

    global_index: int
    lane_id: int
    chunk_id: int
    docs: np.ndarray

    def __len__(self) -> int:
        return int(self.docs.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Chunk):
            return NotImplemented
        return (
            self.global_index == other.global_index
            and self.lane_id == other.lane_id
            and self.chunk_id == other.chunk_id
            and np.array_equal(self.docs, other.docs)
        )

    __hash__ = None  # type: ignore[assignment]

    def refs(self) -> list[DocRef]:
        """The documents as :class:`DocRef` tuples, in chunk order."""
        return [DocRef(*row) for row in self.docs.tolist()]


@dataclass(frozen=True, slots=True)
class _State:
    """Position of the work source at the start of global chunk ``g``."""

    g: int
    samples: int
    passes: tuple[int, ...]
    consumed: tuple[int, ...]
    active: tuple[bool, ...]
    current: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "global_index": self.g,
            "samples": self.samples,
            "datasets": [
                {"pass": p, "consumed": k, "active": a, "current": c}
                for p, k, a, c in zip(self.passes, self.consumed, self.active, self.current)
            ],
        }


class _StateStore:
    """Known states by global chunk index: long-lived snapshots plus a window of recent ones."""

    def __init__(self, max_snapshots: int, max_recent: int) -> None:
        self._snap: OrderedDict[int, _State] = OrderedDict()
        self._recent: OrderedDict[int, _State] = OrderedDict()
        self._max_snap = max_snapshots
        self._max_recent = max_recent
        self._keys: list[int] = []

    def _drop_key(self, g: int) -> None:
        if g not in self._snap and g not in self._recent:
            i = bisect.bisect_left(self._keys, g)
            if i < len(self._keys) and self._keys[i] == g:
                del self._keys[i]

    def _add_key(self, g: int) -> None:
        i = bisect.bisect_left(self._keys, g)
        if i == len(self._keys) or self._keys[i] != g:
            self._keys.insert(i, g)

    def add(self, st: _State, snapshot: bool) -> None:
        table, limit = (
            (self._snap, self._max_snap) if snapshot else (self._recent, self._max_recent)
        )
        table[st.g] = st
        table.move_to_end(st.g)
        self._add_key(st.g)
        while len(table) > limit:
            g, _ = table.popitem(last=False)
            self._drop_key(g)

    def floor(self, g: int) -> _State | None:
        """The known state with the largest index ``<= g``."""
        i = bisect.bisect_right(self._keys, g) - 1
        if i < 0:
            return None
        key = self._keys[i]
        st = self._recent.get(key)
        if st is None:
            st = self._snap[key]
            self._snap.move_to_end(key)
        return st


class WorkSource:
    """Deterministic global sequence of chunks of document pointers, routed to lanes.

    ``datasets`` must be in index order (``datasets[i].index == i``) and each must hold rows.
    Thread-safe: concurrent lane iterators share the cached states.
    """

    def __init__(
        self, datasets: Sequence[DatasetInfo], *, seed: int, lanes: int, chunk_size: int
    ) -> None:
        for name, value, low in (
            ("lanes", lanes, 1),
            ("chunk_size", chunk_size, 1),
            ("seed", seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        seed, lanes, chunk_size = int(seed), int(lanes), int(chunk_size)
        if not datasets:
            raise ConfigError("the work source needs at least one dataset")
        for i, ds in enumerate(datasets):
            if ds.index != i:
                raise ConfigError(
                    f"dataset {ds.name!r} has index {ds.index} but is at position {i} "
                    "(pass datasets in index order, as resolve_datasets returns them)"
                )
            if ds.num_rows <= 0:
                raise ConfigError(f"dataset {ds.name!r} has no rows (add data or remove it)")
        self.datasets = list(datasets)
        self.seed = seed
        self.lanes = lanes
        self.chunk_size = chunk_size
        self.weights = [max(1, round(float(ds.spec.weight) * WEIGHT_SCALE)) for ds in datasets]
        self._rows = [ds.num_rows for ds in datasets]
        self._shard_rows = [
            np.array([s.num_rows for s in ds.shards], dtype=np.int64) for ds in datasets
        ]
        self._repeat = [ds.spec.exhaustion == "repeat" for ds in datasets]
        self._lock = threading.RLock()
        self._swrr = Swrr(self.weights)
        self._store = _StateStore(MAX_SNAPSHOTS, max(256, 4 * lanes))
        self._end: int | None = None  # first global index with no active dataset, once known
        self._rec_window = max(16, 2 * lanes)
        self._recs: OrderedDict[int, tuple[_State, np.ndarray]] = OrderedDict()
        self._layouts: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._row_perms: OrderedDict[tuple[int, int, int], Permutation] = OrderedDict()
        self._lane_perms: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        n = len(datasets)
        self._initial = _State(0, 0, (0,) * n, (0,) * n, (True,) * n, (0,) * n)

    # ------------------------------------------------------------------ lanes

    def _lane_perm(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            hit = self._lane_perms.get(block)
            if hit is not None:
                self._lane_perms.move_to_end(block)
                return hit
            perm = Permutation((_TAG_LANES, self.seed, block), self.lanes).full()
            value = (perm, np.argsort(perm))
            self._lane_perms[block] = value
            if len(self._lane_perms) > _LANE_PERM_CACHE:
                self._lane_perms.popitem(last=False)
            return value

    def lane_of(self, g: int) -> int:
        """The lane that global chunk ``g`` is routed to."""
        if g < 0:
            raise ValueError(f"global chunk index must be >= 0, got {g}")
        if self.lanes == 1:
            return 0
        return int(self._lane_perm(g // self.lanes)[0][g % self.lanes])

    def global_index(self, lane: int, chunk_id: int) -> int:
        """The global index of lane ``lane``'s chunk ``chunk_id`` (inverse of :meth:`lane_of`)."""
        if not 0 <= lane < self.lanes:
            raise ValueError(f"lane must be in [0, {self.lanes}), got {lane}")
        if chunk_id < 0:
            raise ValueError(f"chunk_id must be >= 0, got {chunk_id}")
        if self.lanes == 1:
            return chunk_id
        return chunk_id * self.lanes + int(self._lane_perm(chunk_id)[1][lane])

    # ------------------------------------------------------------------ state

    @property
    def total_chunks(self) -> int | None:
        """Number of chunks in the stream, or ``None`` when some dataset repeats (infinite)."""
        if any(self._repeat):
            return None
        return -(-sum(self._rows) // self.chunk_size)

    @property
    def total_samples(self) -> int | None:
        """Number of samples in the stream, or ``None`` when it is infinite."""
        return None if any(self._repeat) else sum(self._rows)

    def state_at(self, g: int) -> dict[str, Any]:
        """The plain-data (JSON-able) state at the start of global chunk ``g``."""
        return self._state(g).to_dict()

    def restore_state(self, state: dict[str, Any]) -> None:
        """Register a known state (from :meth:`state_at`) so later chunks need no replay.

        Raises :class:`ConfigError` when the state does not fit these datasets or chunk size.
        """
        st = self._parse_state(state)
        with self._lock:
            self._store.add(st, snapshot=True)
            if not any(st.active) and (self._end is None or st.g < self._end):
                self._end = st.g

    def _parse_state(self, state: dict[str, Any]) -> _State:
        def bad(msg: str) -> ConfigError:
            return ConfigError(f"work source state: {msg}")

        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise bad(
                f"version {found!r} is not supported (expected a dict with version "
                f"{STATE_VERSION}; the checkpoint comes from another Zephon version)"
            )
        entries = state.get("datasets")
        if not isinstance(entries, list) or len(entries) != len(self.datasets):
            found = len(entries) if isinstance(entries, list) else entries
            raise bad(
                f"it describes {found!r} datasets but this pipeline has {len(self.datasets)} "
                "(the checkpoint comes from another dataset configuration)"
            )
        g, samples = state.get("global_index"), state.get("samples")
        if not _is_int(g, 0) or not _is_int(samples, 0):
            raise bad(f"global_index and samples must be integers >= 0, got {g!r}, {samples!r}")
        fields = []
        for i, entry in enumerate(entries):
            name, rows = self.datasets[i].name, self._rows[i]
            try:
                p, k, a, c = entry["pass"], entry["consumed"], entry["active"], entry["current"]
            except (KeyError, TypeError) as exc:
                raise bad(f"dataset {name!r}: missing field {exc}") from exc
            ok = _is_int(p, 0) and _is_int(k, 0) and isinstance(a, bool) and _is_int(c)
            # Active datasets are inside a pass; only an exhausted `stop` dataset is inactive.
            ok = ok and (k < rows if a else (not self._repeat[i] and k == rows and c == 0))
            if not ok:
                raise bad(
                    f"dataset {name!r}: inconsistent entry {entry!r} for a dataset of {rows} "
                    f"rows with exhaustion {self.datasets[i].spec.exhaustion!r}"
                )
            fields.append((p, k, a, c))
        passes, consumed, active, current = (tuple(col) for col in zip(*fields))
        if any(active) and samples != g * self.chunk_size:
            raise bad(
                f"samples={samples} does not match global_index={g} with chunk_size="
                f"{self.chunk_size} (the checkpoint was made with another chunk size)"
            )
        return _State(g, samples, passes, consumed, active, current)

    def _state(self, g: int) -> _State:
        if not _is_int(g, 0):
            raise ValueError(f"global chunk index must be an integer >= 0, got {g!r}")
        with self._lock:
            if self._end is not None and g >= self._end:
                end = self._store.floor(self._end)
                if end is not None and not any(end.active):
                    return replace(end, g=g)
            st = self._store.floor(g) or self._initial
            while st.g < g:
                if not any(st.active):
                    self._note_end(st.g)
                    return replace(st, g=g)
                # Chunks close to g are likely to be asked for soon (by other lanes): keep
                # their per-sample records so materialising them needs no second SWRR run.
                near = g - st.g <= self._rec_window
                nxt, rec = self._advance(st, record=near)
                if rec is not None:
                    self._recs[st.g] = (nxt, rec)
                    if len(self._recs) > self._rec_window:
                        self._recs.popitem(last=False)
                st = nxt
                self._remember(st)
            return st

    def _remember(self, st: _State) -> None:
        self._store.add(st, snapshot=st.g % SNAPSHOT_EVERY == 0)
        if not any(st.active):
            self._note_end(st.g)
            self._store.add(st, snapshot=True)

    def _note_end(self, g: int) -> None:
        if self._end is None or g < self._end:
            self._end = g
            logger.debug("work source ends before global chunk %d", g)

    # ------------------------------------------------------------------ generation

    def _advance(self, st: _State, record: bool) -> tuple[_State, np.ndarray | None]:
        """Take up to ``chunk_size`` samples from ``st``: the state at ``st.g + 1`` and, when
        ``record``, the chunk's docs array (dataset, shard, row, pass per sample)."""
        passes = list(st.passes)
        consumed = list(st.consumed)
        active = list(st.active)
        current = list(st.current)
        left = self.chunk_size
        taken = 0
        docs = np.empty((left, 4), dtype=np.int64) if record else None
        while left > 0:
            act = tuple(j for j, a in enumerate(active) if a)
            if not act:
                break
            cur = tuple(current[j] for j in act)
            sel, cur_after = self._swrr.run(act, cur, left)
            counts = np.bincount(sel, minlength=len(active))
            cut, stopped = len(sel), -1
            for j in act:
                remaining = self._rows[j] - consumed[j]
                if not self._repeat[j] and counts[j] >= remaining:
                    end = int(np.flatnonzero(sel == j)[remaining - 1]) + 1
                    if end <= cut:
                        cut, stopped = end, j
            if cut < len(sel):
                sel = sel[:cut]
                cur_after = self._swrr.run(act, cur, cut)[1]
                counts = np.bincount(sel, minlength=len(active))
            for j in act:
                n = int(counts[j])
                if docs is not None and n:
                    self._fill(docs, np.flatnonzero(sel == j) + taken, j, passes[j], consumed[j])
                new = consumed[j] + n
                if self._repeat[j]:
                    passes[j] += new // self._rows[j]
                    new %= self._rows[j]
                consumed[j] = new
            for x, j in enumerate(act):
                current[j] = cur_after[x]
            if stopped >= 0:
                active[stopped] = False
                current[stopped] = 0
            taken += cut
            left -= cut
        nxt = _State(
            st.g + 1,
            st.samples + taken,
            tuple(passes),
            tuple(consumed),
            tuple(active),
            tuple(current),
        )
        return nxt, (None if docs is None else docs[:taken])

    def _fill(self, docs: np.ndarray, at: np.ndarray, d: int, p: int, k: int) -> None:
        """Write the samples ``k, k+1, ...`` of dataset ``d`` (pass ``p`` on, wrapping into
        later passes) to the rows ``at`` of ``docs``.

        A run of consecutive samples of a pass is a run through the permuted shards, so each
        (pass, shard) piece is one slice of that shard's row permutation.
        """
        rows_d = self._rows[d]
        done = 0
        while done < len(at):
            perm, bounds = self._layout(d, p)
            slot = int(np.searchsorted(bounds, k, side="right")) - 1
            shard = int(perm[slot])
            offset = k - int(bounds[slot])
            n = min(len(at) - done, int(bounds[slot + 1]) - k)
            where = at[done : done + n]
            docs[where, 0] = d
            docs[where, 1] = shard
            docs[where, 2] = self._row_perm(d, p, shard).at_range(offset, offset + n)
            docs[where, 3] = p
            done += n
            k += n
            if k == rows_d:
                p, k = p + 1, 0

    def _layout(self, d: int, p: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard permutation, cumulative row bounds in that order) of pass ``p`` of ``d``."""
        key = (d, p)
        hit = self._layouts.get(key)
        if hit is not None:
            self._layouts.move_to_end(key)
            return hit
        perm = Permutation((_TAG_SHARDS, self.seed, d, p), len(self._shard_rows[d])).full()
        bounds = np.zeros(len(perm) + 1, dtype=np.int64)
        np.cumsum(self._shard_rows[d][perm], out=bounds[1:])
        self._layouts[key] = (perm, bounds)
        if len(self._layouts) > _LAYOUT_CACHE:
            self._layouts.popitem(last=False)
        return perm, bounds

    def _row_perm(self, d: int, p: int, s: int) -> Permutation:
        """The row order of shard ``s`` of dataset ``d`` in pass ``p`` (evaluated, not stored)."""
        key = (d, p, s)
        hit = self._row_perms.get(key)
        if hit is not None:
            self._row_perms.move_to_end(key)
            return hit
        perm = Permutation((_TAG_ROWS, self.seed, d, p, s), int(self._shard_rows[d][s]))
        self._row_perms[key] = perm
        if len(self._row_perms) > _ROW_PERM_CACHE:
            self._row_perms.popitem(last=False)
        return perm

    def _materialize(self, st: _State) -> tuple[np.ndarray | None, _State]:
        """The docs of the chunk starting at ``st`` (None past the end) and the next state."""
        if not any(st.active):
            return None, replace(st, g=st.g + 1)
        cached = self._recs.pop(st.g, None)
        if cached is not None:
            nxt, docs = cached
        else:
            nxt, maybe = self._advance(st, record=True)
            assert maybe is not None
            docs = maybe
        docs.flags.writeable = False
        return docs, nxt

    def _make_chunk(self, g: int, docs: np.ndarray) -> Chunk:
        return Chunk(global_index=g, lane_id=self.lane_of(g), chunk_id=g // self.lanes, docs=docs)

    def chunk(self, g: int) -> Chunk | None:
        """Global chunk ``g``, or ``None`` when the stream ended before it."""
        with self._lock:
            st = self._state(g)
            docs, nxt = self._materialize(st)
            if docs is None:
                return None
            self._remember(nxt)
        return self._make_chunk(g, docs)

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """Global chunks from ``start`` on, in order, until the end of the stream."""
        with self._lock:
            st = self._state(start)
        while True:
            with self._lock:
                docs, nxt = self._materialize(st)
                if docs is None:
                    return
                self._remember(nxt)
            yield self._make_chunk(st.g, docs)
            st = nxt

    def lane_chunks(self, lane: int, start_chunk_id: int = 0) -> Iterator[Chunk]:
        """Lane ``lane``'s chunks from lane-local id ``start_chunk_id`` on, until the end."""
        self.global_index(lane, start_chunk_id)  # validates the arguments eagerly
        return self._lane_iter(lane, start_chunk_id)

    def _lane_iter(self, lane: int, chunk_id: int) -> Iterator[Chunk]:
        while True:
            c = self.chunk(self.global_index(lane, chunk_id))
            if c is None:
                return
            yield c
            chunk_id += 1


def _is_int(v: object, low: int | None = None) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low)
