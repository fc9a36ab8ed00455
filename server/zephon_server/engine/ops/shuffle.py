"""``shuffle``: per-lane shuffling whose randomness is derived from the data, never from an RNG.

An RNG advanced per micro-batch would tie the permutation to micro-batch boundaries, which
move across restarts. Every decision here is instead a hash (:func:`mix64`, splitmix64's
finaliser, over 64-bit ints) of record cursors, the seed (the operator's ``seed`` combined
with the pipeline seed) and the lane, so the same elements shuffle the same way whatever the
grouping, the runner or the restart. Python's ``hash()`` is never used (it is salted).

Algorithms (``algorithm=``):

* ``streaming`` (default): a per-lane reservoir of ``buffer_size`` records. Until it is full an
  arrival is just added; afterwards each arrival picks the victim slot
  ``h(cursor salt, seed, lane, emission counter, size) % size``, the victim is emitted and the
  arrival takes its place. A flush emits the rest in order of ``h(cursor salt, seed, lane)``.
* ``block``: a counting accumulator cuts each lane into blocks of ``buffer_size`` records and
  the workers permute each block, ordering its records by ``h(block key, cursor salt)`` where
  the block key hashes the seed, the lane and the *set* of the block's cursors.
* ``block_warmup``: like ``block``, but a lane's block size starts at ``warmup_size`` and
  doubles after every emitted block up to ``buffer_size`` (``warmup_size, 2*warmup_size, ...,
  buffer_size``); a reset (flush sentinel) starts the lane at ``warmup_size`` again, so the
  first batches of every epoch come out quickly.

Tombstones (dropped records) are never buffered by any of the three: they leave immediately,
ahead of records that arrived before them and are still buffered. At a flush sentinel every
algorithm emits the lane's buffer (partial blocks are permuted like full ones) and forgets
the lane, so everything from before a sentinel leaves before anything after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, ContractError
from ..records import Cursor, SampleRecord
from .accumulators import Accumulator, CountingAccumulator, MicroBatch
from .base import OpContext, Operator, OpTraits

MASK64 = (1 << 64) - 1
SHUFFLE_ALGORITHMS: tuple[str, ...] = ("streaming", "block", "block_warmup")
#: Domain tag mixed into the shuffle seed, so it is not correlated with other seeded uses.
_SHUFFLE_DOMAIN = 0x5348_5546_464C_4531  # "SHUFFLE1"


# -- deterministic hashing ---------------------------------------------------------------


def mix64(x: int) -> int:
    """splitmix64 of ``x`` (masked to 64 bits): a bijective, well-mixed 64-bit hash."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def hash_ints(values: Sequence[int], seed: int = 0) -> int:
    """A 64-bit hash of a sequence of ints (any sign, taken mod 2**64) and a seed.

    Stable across processes, platforms and Python versions; the length is mixed in first so
    sequences that are prefixes of one another differ.
    """
    h = mix64((seed & MASK64) ^ len(values))
    for v in values:
        h = mix64(h ^ (v & MASK64))
    return h


def cursor_hash(cursor: Cursor, seed: int = 0) -> int:
    """The per-record salt: a 64-bit hash of a cursor (a tuple of ints) and a seed."""
    return hash_ints(cursor, seed)


def _is_tombstone(elem: Any) -> bool:
    return type(elem) is SampleRecord and bool(elem.meta.tombstone)


def _emit_tombstone(outs: list[MicroBatch], elem: Any, last: dict[int, MicroBatch]) -> None:
    """Append a tombstone as its own micro-batch, merging runs of the same lane's tombstones."""
    lane = elem.meta.lane_id
    group = last.get(lane)
    if group is not None and outs and outs[-1] is group:
        group.append(elem)
    else:
        group = [elem]
        outs.append(group)
        last[lane] = group


def block_order(elems: Sequence[Any], seed: int) -> list[int]:
    """The permutation of a block: indices sorted by ``h(block key, cursor salt)``.

    The block key hashes ``seed``, the lane and the *set* of the block's cursors (a sum of
    their salts), so it does not depend on the order the block arrived in.
    """
    if not elems:
        return []
    lane = elems[0].meta.lane_id
    salts = [cursor_hash(e.meta.cursor, seed) for e in elems]
    key = hash_ints((lane, sum(salts) & MASK64, len(salts)), seed)
    keys = [mix64(key ^ s) for s in salts]
    return sorted(range(len(elems)), key=lambda i: (keys[i], elems[i].meta.cursor))


# -- accumulators -------------------------------------------------------------------------


class _Reservoir:
    """Per-lane reservoir and its emission counter."""

    __slots__ = ("emitted", "items", "lane_seed")

    def __init__(self, lane_seed: int) -> None:
        self.items: list[Any] = []
        self.emitted = 0
        self.lane_seed = lane_seed


class ReservoirAccumulator(Accumulator):
    """The ``streaming`` shuffle: a per-lane reservoir with data-derived victims."""

    def __init__(self, buffer_size: int, seed: int) -> None:
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an integer >= 1, got {buffer_size!r}")
        self.buffer_size = buffer_size
        self.seed = seed & MASK64
        self._lanes: dict[int, _Reservoir] = {}

    def _lane(self, lane_id: int) -> _Reservoir:
        slot = self._lanes.get(lane_id)
        if slot is None:
            lane_seed = hash_ints((lane_id, self.buffer_size), self.seed)
            slot = self._lanes[lane_id] = _Reservoir(lane_seed)
        return slot

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        # One micro-batch per lane and call, in that lane's event order (victims, tombstones).
        outs: dict[int, MicroBatch] = {}
        size = self.buffer_size
        seed = self.seed
        for elem in elems:
            lane_id = elem.meta.lane_id
            if _is_tombstone(elem):
                outs.setdefault(lane_id, []).append(elem)
                continue
            slot = self._lane(lane_id)
            items = slot.items
            if len(items) < size:
                items.append(elem)
                continue
            salt = cursor_hash(elem.meta.cursor, seed)
            victim = mix64(mix64(slot.lane_seed ^ slot.emitted) ^ salt) % size
            slot.emitted += 1
            outs.setdefault(lane_id, []).append(items[victim])
            items[victim] = elem
        return list(outs.values())

    def _drain(self, slot: _Reservoir) -> list[Any]:
        seed = slot.lane_seed
        items = slot.items
        order = sorted(
            range(len(items)),
            key=lambda i: (cursor_hash(items[i].meta.cursor, seed), items[i].meta.cursor),
        )
        return [items[i] for i in order]

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        if lane_id is None:
            groups = [self._drain(self._lanes[lid]) for lid in sorted(self._lanes)]
            self._lanes.clear()
            return [g for g in groups if g]
        slot = self._lanes.pop(lane_id, None) if reset else self._lanes.get(lane_id)
        if slot is None or not slot.items:
            return []
        out = self._drain(slot)
        slot.items = []
        return [out]

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        if lane_id is not None:
            slot = self._lanes.get(lane_id)
            return bool(slot and slot.items)
        return any(slot.items for slot in self._lanes.values())

    def lanes_state(self) -> dict[int, int]:
        """Buffered record count per lane (for tests and metrics)."""
        return {lid: len(s.items) for lid, s in self._lanes.items() if s.items}


class BlockAccumulator(CountingAccumulator):
    """The ``block`` shuffle's grouping: blocks of ``max_batch`` records; tombstones bypass.

    A tombstone is emitted immediately as its own micro-batch (never part of a block), so the
    workers permute whole blocks of live records.
    """

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        outs: list[MicroBatch] = []
        tomb: dict[int, MicroBatch] = {}
        run: list[Any] = []
        for elem in elems:
            if _is_tombstone(elem):
                if run:
                    outs.extend(super().push_many(run))
                    run = []
                _emit_tombstone(outs, elem, tomb)
            else:
                run.append(elem)
        if run:
            outs.extend(super().push_many(run))
        return outs


class _WarmupSlot:
    """Per-lane block of a :class:`WarmupBlockAccumulator` and its current target size."""

    __slots__ = ("items", "size")

    def __init__(self, size: int) -> None:
        self.items: list[Any] = []
        self.size = size


class WarmupBlockAccumulator(Accumulator):
    """The ``block_warmup`` grouping: per-lane block size ``warmup_size`` doubling to ``max_batch``.

    After each emitted block the lane's size doubles (capped at ``max_batch``); a reset
    (``flush(reset=True, lane_id=l)``) forgets the lane, so it starts at ``warmup_size``
    again. Tombstones bypass the blocks, as in :class:`BlockAccumulator`. Boundaries depend
    only on counts (no latency bound).
    """

    def __init__(self, max_batch: int, warmup_size: int) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not isinstance(warmup_size, int) or not 1 <= warmup_size <= max_batch:
            raise ValueError(
                f"warmup_size must be an integer in [1, max_batch={max_batch}], got {warmup_size!r}"
            )
        self.max_batch = max_batch
        self.warmup_size = warmup_size
        self._lanes: dict[int, _WarmupSlot] = {}

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        outs: list[MicroBatch] = []
        tomb: dict[int, MicroBatch] = {}
        lanes = self._lanes
        for elem in elems:
            if _is_tombstone(elem):
                _emit_tombstone(outs, elem, tomb)
                continue
            lane = elem.meta.lane_id
            slot = lanes.get(lane)
            if slot is None:
                slot = lanes[lane] = _WarmupSlot(self.warmup_size)
            slot.items.append(elem)
            if len(slot.items) >= slot.size:
                outs.append(slot.items)
                slot.items = []
                slot.size = min(slot.size * 2, self.max_batch)
        return outs

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        if lane_id is None:
            groups = [self._lanes[lid].items for lid in sorted(self._lanes)]
            self._lanes.clear()
            return [g for g in groups if g]
        slot = self._lanes.pop(lane_id, None) if reset else self._lanes.get(lane_id)
        if slot is None or not slot.items:
            return []
        items, slot.items = slot.items, []
        return [items]

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        if lane_id is not None:
            slot = self._lanes.get(lane_id)
            return bool(slot and slot.items)
        return any(slot.items for slot in self._lanes.values())

    def block_size(self, lane_id: int) -> int:
        """The size of the lane's next block."""
        slot = self._lanes.get(lane_id)
        return slot.size if slot else self.warmup_size


# -- the operator -------------------------------------------------------------------------


class Shuffle(Operator):
    """Shuffles each lane within a bounded buffer, deterministically (see the module docstring).

    ``buffer_size`` is the reservoir size (``streaming``) or the block size (``block``, and the
    final block size of ``block_warmup``); ``seed`` is combined with the pipeline seed.
    """

    op_name = "shuffle"
    default_parallelism = 0  # cheap next to tokenizing: runs in its driver thread

    def __init__(
        self,
        *,
        buffer_size: int = 1024,
        seed: int = 0,
        algorithm: str = "streaming",
        warmup_size: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(f"shuffle: buffer_size must be an integer >= 1, got {buffer_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"shuffle: seed must be an integer, got {seed!r}")
        if algorithm not in SHUFFLE_ALGORITHMS:
            raise ConfigError(
                f"shuffle: algorithm must be one of {list(SHUFFLE_ALGORITHMS)}, got {algorithm!r}"
            )
        if isinstance(warmup_size, bool) or not isinstance(warmup_size, int) or warmup_size < 1:
            raise ConfigError(f"shuffle: warmup_size must be an integer >= 1, got {warmup_size!r}")
        if algorithm == "block_warmup" and warmup_size > buffer_size:
            raise ConfigError(
                f"shuffle: warmup_size must be <= buffer_size ({buffer_size}) for "
                f"algorithm 'block_warmup', got {warmup_size!r}"
            )
        self.buffer_size = buffer_size
        self.seed = seed
        self.algorithm = algorithm
        self.warmup_size = warmup_size
        self._mixed_seed: int | None = None

    @property
    def microbatch_size(self) -> int:
        """Blocks shape the data, so the block algorithms ignore a ``microbatch_size`` override."""
        if self.algorithm == "streaming":
            return super().microbatch_size
        return self.buffer_size

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "buffer_size": self.buffer_size,
            "seed": self.seed,
            "algorithm": self.algorithm,
        }
        if self.algorithm == "block_warmup":
            params["warmup_size"] = self.warmup_size
        return params

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, fusable=False)

    def mixed_seed(self, ctx: OpContext) -> int:
        """The 64-bit seed every decision hashes: the pipeline seed and ``seed`` combined."""
        return hash_ints((ctx.seed, self.seed), _SHUFFLE_DOMAIN)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._mixed_seed = self.mixed_seed(ctx)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        if self.algorithm == "streaming":
            return ReservoirAccumulator(self.buffer_size, self.mixed_seed(ctx))
        if self.algorithm == "block":
            return BlockAccumulator(
                self.buffer_size, max_latency_ms=None if deterministic else self.max_latency_ms
            )
        return WarmupBlockAccumulator(self.buffer_size, self.warmup_size)

    def process_many(self, elems: list[Any]) -> list[Any]:
        if self.algorithm == "streaming":
            return elems
        if self._mixed_seed is None:
            raise ContractError("shuffle: setup(ctx) must run before process_many")
        return [elems[i] for i in block_order(elems, self._mixed_seed)]


__all__ = [
    "BlockAccumulator",
    "ReservoirAccumulator",
    "Shuffle",
    "WarmupBlockAccumulator",
    "block_order",
    "cursor_hash",
    "hash_ints",
    "mix64",
]
