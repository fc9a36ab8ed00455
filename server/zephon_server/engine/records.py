"""Records, cursors and batches: the elements that flow between operators.

A :class:`SampleRecord` is a payload plus a :class:`SampleMeta`. The meta carries the record's
identity within its lane (the *cursor*), which document(s) it came from, and which documents
it *closes* (finishes) so that accounting stays exact when operators split, pack or drop
records. Operators rebuild payloads but carry meta forward (``record.with_payload``).

Cursors are tuples of ints, ``(chunk_id, offset_in_chunk, *lineage)``: unique within a lane and
totally ordered by tuple comparison. Derived records (split children, packed rows) extend the
lineage of a parent cursor, so they stay unique and ordered.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

Cursor = tuple[int, ...]


class DocRef(NamedTuple):
    """Identity of one source document: dataset index, shard index, row in shard, pass."""

    dataset: int
    shard: int
    row: int
    epoch: int = 0


class Span(NamedTuple):
    """A run of ``length`` tokens of document ``doc`` starting at token ``start`` of that doc."""

    doc: DocRef
    start: int
    length: int


class SampleMeta:
    """Identity and lineage of a record; immutable by convention (use :meth:`replace`)."""

    __slots__ = ("closes", "cursor", "dataset_id", "doc", "lane_id", "spans", "tombstone")

    def __init__(
        self,
        lane_id: int,
        cursor: Cursor,
        dataset_id: int = -1,
        doc: DocRef | None = None,
        closes: tuple[DocRef, ...] = (),
        spans: tuple[Span, ...] = (),
        tombstone: str = "",
    ) -> None:
        self.lane_id = lane_id
        self.cursor = cursor
        self.dataset_id = dataset_id
        self.doc = doc
        self.closes = closes
        self.spans = spans
        self.tombstone = tombstone

    @property
    def chunk_id(self) -> int:
        """The lane-local chunk this record (or its first ancestor) came from."""
        return self.cursor[0]

    @property
    def chunk_offset(self) -> int:
        """Offset of the record's root document within its chunk."""
        return self.cursor[1]

    def replace(self, **changes: Any) -> SampleMeta:
        """A copy with some fields changed."""
        values = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return SampleMeta(**values)

    def with_spans(self, spans: tuple[Span, ...]) -> SampleMeta:
        """A copy with ``spans`` replaced (the per-record hot path of ``tokenize``)."""
        return SampleMeta(
            self.lane_id,
            self.cursor,
            self.dataset_id,
            self.doc,
            self.closes,
            spans,
            self.tombstone,
        )

    def child(self, index: int, **changes: Any) -> SampleMeta:
        """Meta for the ``index``-th record derived from this one (extends the cursor)."""
        return self.replace(cursor=(*self.cursor, index), **changes)

    def as_tombstone(self, reason: str) -> SampleMeta:
        """Meta of a payload-less record that closes this record's documents.

        ``reason`` says why it was dropped (``malformed``, ``filtered``, ``dropped_last``, ...).
        """
        return self.replace(tombstone=reason or "dropped", spans=())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleMeta):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self) -> int:
        return hash((self.lane_id, self.cursor))

    def __repr__(self) -> str:
        extra = f" tombstone={self.tombstone}" if self.tombstone else ""
        return f"SampleMeta(lane={self.lane_id}, cursor={self.cursor}, ds={self.dataset_id}{extra})"


class SampleRecord:
    """One element of a lane's stream: a payload (dict of fields) plus its meta."""

    __slots__ = ("meta", "payload")

    def __init__(self, payload: Any, meta: SampleMeta) -> None:
        self.payload = payload
        self.meta = meta

    @property
    def lane_id(self) -> int:
        return self.meta.lane_id

    @property
    def cursor(self) -> Cursor:
        return self.meta.cursor

    def with_payload(self, payload: Any, **meta_changes: Any) -> SampleRecord:
        """The same identity with a rebuilt payload (and optionally changed meta fields)."""
        meta = self.meta.replace(**meta_changes) if meta_changes else self.meta
        return SampleRecord(payload, meta)

    def tombstone(self, reason: str) -> SampleRecord:
        """A payload-less record closing this record's documents (used when dropping it)."""
        return SampleRecord(None, self.meta.as_tombstone(reason))

    def __repr__(self) -> str:
        return f"SampleRecord({self.meta!r})"


class SampleBatch:
    """A lane-pure group of rows as named tensors, as an operator makes it.

    ``rows`` holds the meta of every row in order (their cursors and spans), ``tombstones``
    the metas of records dropped since the previous batch of the lane, so every document's
    closing is visible in the output. The lane output log numbers it into a
    :class:`~.numbered_batch.NumberedBatch` (seq, digests, wire view), the unit sent to
    trainers.
    """

    __slots__ = ("lane_id", "rows", "tensors", "tombstones")

    def __init__(
        self,
        lane_id: int,
        tensors: dict[str, np.ndarray],
        rows: tuple[SampleMeta, ...],
        tombstones: tuple[SampleMeta, ...] = (),
    ) -> None:
        self.lane_id = lane_id
        self.tensors = tensors
        self.rows = rows
        self.tombstones = tombstones

    @property
    def cursor(self) -> Cursor:
        """Cursor of the batch's last row: a batch is ordered by its last record."""
        return self.rows[-1].cursor if self.rows else ()

    @property
    def meta(self) -> SampleMeta:
        """Meta of the last row (so per-lane machinery can treat batches like records)."""
        return self.rows[-1]

    def closes(self) -> Iterable[DocRef]:
        """Every document this batch closes (rows and tombstones)."""
        return batch_closes(self.rows, self.tombstones)

    def num_tokens(self) -> int:
        """Non-padding tokens in the batch."""
        return count_tokens(self.tensors)

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.tensors.items()}
        return f"SampleBatch(lane={self.lane_id}, rows={len(self.rows)}, {shapes})"


def batch_closes(rows: Iterable[SampleMeta], tombstones: Iterable[SampleMeta]) -> Iterator[DocRef]:
    """Every document a batch closes: its rows', then its tombstones' (one definition for
    :class:`SampleBatch` and the numbered batch)."""
    for meta in rows:
        yield from meta.closes
    for meta in tombstones:
        yield from meta.closes


def count_tokens(tensors: Mapping[str, np.ndarray]) -> int:
    """Non-padding tokens of a batch's tensors: ``padding_mask``'s ones, else every id."""
    mask = tensors.get("padding_mask")
    if mask is not None:
        return int(np.count_nonzero(mask))
    ids = tensors.get("input_ids")
    return 0 if ids is None else int(ids.size)


@dataclass(frozen=True, slots=True)
class FlushSentinel:
    """Control element injected into a lane every K chunks: an epoch boundary.

    ``boundary_chunk_id`` is the first lane chunk id of the new epoch; every record with a
    smaller chunk id belongs to an earlier epoch.
    """

    lane_id: int
    boundary_chunk_id: int


@dataclass(frozen=True, slots=True)
class LaneEnd:
    """Control element closing a lane: no more elements of ``lane_id`` follow."""

    lane_id: int


Element = SampleRecord | SampleBatch
Control = FlushSentinel | LaneEnd
