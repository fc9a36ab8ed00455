"""Bin-packing algorithms behind ``pack_sequences`` and ``pack_flat``: pure, per lane.

A :class:`LaneBins` is one lane's packing state: its open bins, in opening order. It places
*items* (the accumulator passes records; here they are opaque) of a given token length and
returns the bins that became ready, in the order they became ready. Nothing here depends on
time, on how the input was grouped into calls, or on other lanes, so the same per-lane input
sequence always gives the same bins.

Algorithms (``max_length`` = bin capacity in tokens):

* ``first_fit``: the first open bin (in opening order) with room for the item;
* ``best_fit``: the open bin with the least room that still fits it (ties: the oldest);
* ``wrap``: one open bin; items are concatenated and cut at ``max_length``, so an item may
  continue in the next bin.

With ``first_fit``/``best_fit`` an item longer than ``max_length`` is cut into ``max_length``
pieces (the last one shorter) that are placed as separate items. When no bin fits, a new one
is opened; if more than ``max_open_bins`` are then open, the oldest is emitted. A bin is
emitted as soon as its remaining room drops below ``min_useful_length`` (so a full bin always
is), or, with ``max_docs_per_row`` set, as soon as it holds that many pieces (so no row ever has
more; unset, the piece count plays no part in any decision).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

ALGORITHMS = ("first_fit", "best_fit", "wrap")
OVERSIZED_POLICIES = ("split", "drop")

#: One run of an item inside a bin: ``(item, start token within the item, length)``.
Piece = tuple[Any, int, int]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def default_min_useful_length(max_length: int) -> int:
    """Default emission threshold: 1/32 of the row, at least one token."""
    return max(1, max_length // 32)


@dataclass(frozen=True, slots=True)
class PackPolicy:
    """The data-shaping knobs of a packer, validated at construction.

    Raises :class:`ConfigError` (a ``ValueError``) naming ``op_name``, the parameter, the value
    and how to fix it.
    """

    max_length: int
    algorithm: str = "first_fit"
    max_open_bins: int = 8
    min_useful_length: int | None = None
    oversized: str = "split"
    op_name: str = "pack"
    max_docs_per_row: int | None = None

    def __post_init__(self) -> None:
        op = self.op_name
        if not _is_int(self.max_length) or self.max_length < 1:
            raise ConfigError(
                f"{op}: max_length must be an integer >= 1, got {self.max_length!r}; set it to "
                "the model's context length in tokens (e.g. max_length=2048)"
            )
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"{op}: algorithm must be one of {', '.join(ALGORITHMS)}, got "
                f"{self.algorithm!r}; use 'first_fit' (the default) unless you need another"
            )
        if not _is_int(self.max_open_bins) or self.max_open_bins < 1:
            raise ConfigError(
                f"{op}: max_open_bins must be an integer >= 1, got {self.max_open_bins!r}; "
                "use a small number such as 8 (the default)"
            )
        if self.min_useful_length is None:
            object.__setattr__(
                self, "min_useful_length", default_min_useful_length(self.max_length)
            )
        elif (
            not _is_int(self.min_useful_length)
            or not 1 <= self.min_useful_length <= self.max_length
        ):
            raise ConfigError(
                f"{op}: min_useful_length must be an integer between 1 and max_length "
                f"({self.max_length}), got {self.min_useful_length!r}; leave it unset for the "
                "default max(1, max_length // 32)"
            )
        if self.oversized not in OVERSIZED_POLICIES:
            raise ConfigError(
                f"{op}: oversized must be one of {', '.join(OVERSIZED_POLICIES)}, got "
                f"{self.oversized!r}; use 'split' to cut long documents or 'drop' to skip them"
            )
        docs = self.max_docs_per_row
        if docs is not None and (not _is_int(docs) or docs < 1):
            raise ConfigError(
                f"{op}: max_docs_per_row must be an integer >= 1, got {docs!r}; it bounds the "
                "documents packed into one row"
            )

    @property
    def threshold(self) -> int:
        """The resolved ``min_useful_length``."""
        assert self.min_useful_length is not None  # resolved in __post_init__
        return self.min_useful_length

    def closes(self, target: Bin) -> bool:
        """Whether ``target`` is ready: too little room left, or ``max_docs_per_row`` pieces."""
        if self.max_length - target.used < self.threshold:
            return True
        docs = self.max_docs_per_row
        return docs is not None and len(target.pieces) >= docs


@dataclass(slots=True, eq=False)
class Bin:
    """An open (or emitted) bin: its pieces in placement order and the tokens they use."""

    pieces: list[Piece] = field(default_factory=list)
    used: int = 0

    def add(self, item: Any, start: int, length: int) -> None:
        self.pieces.append((item, start, length))
        self.used += length


@dataclass(slots=True, eq=False)
class LaneBins:
    """One lane's packing state (a fresh instance is a freshly reset lane)."""

    policy: PackPolicy
    bins: list[Bin] = field(default_factory=list)

    def add(self, item: Any, length: int) -> list[Bin]:
        """Place ``length`` tokens of ``item``; the bins that became ready, in order."""
        emitted: list[Bin] = []
        if length <= 0:
            return emitted
        if self.policy.algorithm == "wrap":
            self._wrap(item, length, emitted)
        else:
            cap = self.policy.max_length
            if length <= cap:
                self._fit(item, 0, length, emitted)
            else:
                for start in range(0, length, cap):
                    self._fit(item, start, min(cap, length - start), emitted)
        return emitted

    def drain(self) -> list[Bin]:
        """Every open bin, in opening order; the lane is left fresh."""
        bins, self.bins = self.bins, []
        return bins

    @property
    def pending(self) -> bool:
        return bool(self.bins)

    def _wrap(self, item: Any, length: int, emitted: list[Bin]) -> None:
        policy = self.policy
        cap = policy.max_length
        start = 0
        while start < length:
            if not self.bins:
                self.bins.append(Bin())
            target = self.bins[0]
            n = min(cap - target.used, length - start)
            target.add(item, start, n)
            start += n
            if policy.closes(target):
                emitted.append(self.bins.pop())

    def _fit(self, item: Any, start: int, n: int, emitted: list[Bin]) -> None:
        policy = self.policy
        cap = policy.max_length
        bins = self.bins
        index = -1
        if policy.algorithm == "first_fit":
            for i, b in enumerate(bins):
                if cap - b.used >= n:
                    index = i
                    break
        else:  # best_fit: least remaining room that fits; strict < keeps the oldest on ties
            best = cap + 1
            for i, b in enumerate(bins):
                room = cap - b.used
                if n <= room < best:
                    index, best = i, room
        opened = index < 0
        if opened:
            bins.append(Bin())
            index = len(bins) - 1
        target = bins[index]
        target.add(item, start, n)
        if policy.closes(target):
            emitted.append(bins.pop(index))
        elif opened and len(bins) > policy.max_open_bins:
            emitted.append(bins.pop(0))
