"""A lane batch's ``StreamBatchesResponse`` bytes, encoded by hand.

:func:`encode_batch_response` returns exactly the bytes protobuf writes for the message that
carries the batch (fields in number order, proto3 zero values left out, minimal varints;
``tests/unit/test_wire.py`` checks that against a protobuf-built oracle on every kind of batch)
without building the message: the tensor bytes are copied once, straight from the batch's wire
view (:attr:`NumberedBatch.wire`, normalised and sorted once by the lane output log), and each
document's identity is encoded once per batch although it appears both in a row source and
among the closed documents; varints below 2**14 come from a table. ``python -m
bench.delivery`` measures it (figures in docs/decisions.md). On a stream with a shared-memory
ring a tensor's header carries ``ring_offset`` instead of the bytes.

:data:`FIELDS` is the encoder's field table: every field it writes, by message, with its
number and wire type; the tags below are made from it, and a test compares it with the
``.proto``'s descriptors, so a field added to the proto that the encoder does not write fails
a test instead of being dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from zephon_wire import DIGEST_SIZE

from ..engine.numbered_batch import NumberedBatch
from ..engine.records import DocRef, SampleMeta
from .wire import WireError, wire_dtype

VARINT, LEN = 0, 2
"""Protobuf wire types the encoder writes."""

FIELDS: dict[str, dict[str, tuple[int, int]]] = {
    "StreamBatchesResponse": {"batch": (1, LEN), "batches": (3, LEN)},
    "BatchGroup": {"batches": (1, LEN)},
    "SampleBatch": {
        "lane": (1, VARINT),
        "seq": (2, VARINT),
        "tensors": (3, LEN),
        "rows": (4, LEN),
        "digest": (5, LEN),
        "chain_digest": (6, LEN),
        "closed": (7, LEN),
    },
    "Tensor": {
        "name": (1, LEN),
        "dtype": (2, VARINT),
        "shape": (3, LEN),  # packed
        "data": (4, LEN),
        "ring_offset": (5, VARINT),
    },
    "RowSource": {"segments": (1, LEN)},
    "Segment": {
        "dataset": (1, VARINT),
        "shard": (2, VARINT),
        "row": (3, VARINT),
        "epoch": (4, VARINT),
        "start": (5, VARINT),
        "length": (6, VARINT),
    },
    "ClosedDocument": {
        "dataset": (1, VARINT),
        "shard": (2, VARINT),
        "row": (3, VARINT),
        "epoch": (4, VARINT),
        "tombstone": (5, LEN),
    },
}
"""Every field the encoder writes: message → field → (number, wire type)."""
BUILT_WITH_PROTOBUF: dict[str, tuple[str, ...]] = {"StreamBatchesResponse": ("end", "ring")}
"""Fields of the encoder's messages that other code writes with protobuf (one small message
per stream: :func:`.wire.end_response`, the ring offer)."""

_VARINTS = [bytes((v,)) for v in range(128)] + [
    bytes((v & 0x7F | 0x80, v >> 7)) for v in range(128, 1 << 14)
]
"""Every one- and two-byte varint, made once (~0.6 MB): most fields of a batch are below 2**14."""


def varint(value: int) -> bytes:
    """``value`` as a protobuf base-128 varint (unsigned fields only)."""
    if value < 1 << 14:
        if value < 0:
            raise WireError(f"cannot encode {value} in an unsigned protobuf field")
        return _VARINTS[value]
    out = bytearray()
    while value > 127:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(message: str, field: str) -> bytes:
    """The encoded tag of ``message.field`` (from :data:`FIELDS`)."""
    number, wire_type = FIELDS[message][field]
    return varint(number << 3 | wire_type)


_RESPONSE_BATCH = tag("StreamBatchesResponse", "batch")
_RESPONSE_GROUP = tag("StreamBatchesResponse", "batches")
_GROUP_BATCH = tag("BatchGroup", "batches")
_LANE, _SEQ = tag("SampleBatch", "lane"), tag("SampleBatch", "seq")
_TENSOR, _ROW = tag("SampleBatch", "tensors"), tag("SampleBatch", "rows")
_DIGEST = tag("SampleBatch", "digest") + varint(DIGEST_SIZE)
_CHAIN = tag("SampleBatch", "chain_digest") + varint(DIGEST_SIZE)
_CLOSED = tag("SampleBatch", "closed")
_T_NAME, _T_DTYPE, _T_SHAPE = tag("Tensor", "name"), tag("Tensor", "dtype"), tag("Tensor", "shape")
_T_DATA, _T_RING = tag("Tensor", "data"), tag("Tensor", "ring_offset")
_SEGMENT = tag("RowSource", "segments")
_DOC = tuple(tag("Segment", f) for f in ("dataset", "shard", "row", "epoch"))
_START, _LENGTH = tag("Segment", "start"), tag("Segment", "length")
_TOMBSTONE = tag("ClosedDocument", "tombstone")
if tuple(tag("ClosedDocument", f) for f in ("dataset", "shard", "row", "epoch")) != _DOC:
    raise AssertionError("Segment and ClosedDocument must share their document fields' tags")


def _len_field(field_tag: bytes, body: bytes) -> bytes:
    return field_tag + varint(len(body)) + body


def _doc_fields(doc: DocRef) -> bytes:
    """``dataset``, ``shard``, ``row``, ``epoch``: fields 1-4 of both Segment and ClosedDocument."""
    return b"".join(t + varint(v) for t, v in zip(_DOC, doc, strict=True) if v)


_EMPTY = memoryview(b"")


class _Docs(dict[DocRef, bytes]):
    """Each document's encoded identity, made once per batch."""

    def __missing__(self, doc: DocRef) -> bytes:
        fields = self[doc] = _doc_fields(doc)
        return fields


def _tensor(name: str, wire: np.ndarray, ring_offset: int | None) -> tuple[bytes, memoryview]:
    """A ``Tensor`` field of SampleBatch from its wire array: its header, then the data to
    append (none when the bytes are in the stream's ring at ``ring_offset``)."""
    code = wire_dtype(name, wire.dtype)
    shape = b"".join(varint(n) for n in wire.shape)
    head = b"".join(
        (
            _len_field(_T_NAME, name.encode()) if name else b"",
            _T_DTYPE + varint(code) if code else b"",
            _len_field(_T_SHAPE, shape) if shape else b"",
        )
    )
    if ring_offset is not None:
        head += _T_RING + varint(ring_offset)
        return _TENSOR + varint(len(head)) + head, _EMPTY
    if not wire.nbytes:
        return _TENSOR + varint(len(head)) + head, _EMPTY
    head += _T_DATA + varint(wire.nbytes)
    return _TENSOR + varint(len(head) + wire.nbytes) + head, wire.data.cast("B")


def closed_fields(docs: _Docs, metas: Iterable[SampleMeta], *, tombstones: bool) -> list[bytes]:
    """``ClosedDocument`` fields of SampleBatch: each meta's ``closes``, with the meta's
    tombstone reason when ``tombstones``."""
    out = []
    for meta in metas:
        reason = b""
        if tombstones and meta.tombstone:
            reason = _len_field(_TOMBSTONE, meta.tombstone.encode())
        for doc in meta.closes:
            body = docs[doc] + reason
            out.append(_CLOSED + varint(len(body)) + body)
    return out


def _rows(docs: _Docs, rows: Iterable[SampleMeta]) -> list[bytes]:
    """One ``RowSource`` field per row: its segments."""
    out = []
    for meta in rows:
        segments = []
        for doc, start, length in meta.spans:
            body = docs[doc]
            if start:
                body += _START + varint(start)
            if length:
                body += _LENGTH + varint(length)
            segments.append(_SEGMENT + varint(len(body)) + body)
        out.append(_len_field(_ROW, b"".join(segments)))
    return out


def _batch_parts(
    batch: NumberedBatch, ring_offsets: Mapping[str, int] | None = None
) -> tuple[list[bytes | memoryview], int]:
    """A ``SampleBatch`` message's fields, in number order, and their total size; tensors in
    the stream's ring when ``ring_offsets`` (name → offset) is given."""
    docs = _Docs()
    parts: list[bytes | memoryview] = [
        _LANE + varint(batch.lane_id) if batch.lane_id else b"",
        _SEQ + varint(batch.seq) if batch.seq else b"",
    ]
    for name, wire in batch.wire:
        parts.extend(_tensor(name, wire, None if ring_offsets is None else ring_offsets[name]))
    parts.extend(_rows(docs, batch.rows))
    parts.append(_DIGEST + batch.digest)
    parts.append(_CHAIN + batch.chain_digest)
    parts.extend(closed_fields(docs, batch.rows, tombstones=False))
    parts.extend(closed_fields(docs, batch.tombstones, tombstones=True))
    return parts, sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def encode_batch_response(
    batch: NumberedBatch, ring_offsets: Mapping[str, int] | None = None
) -> bytes:
    """The serialized ``StreamBatchesResponse`` carrying ``batch`` (see the module docstring)."""
    parts, size = _batch_parts(batch, ring_offsets)
    return b"".join((_RESPONSE_BATCH, varint(size), *parts))


def encode_group_response(
    batches: Sequence[NumberedBatch], ring_offsets: Sequence[Mapping[str, int]] | None = None
) -> bytes:
    """The serialized ``StreamBatchesResponse`` carrying ``batches`` in one ``BatchGroup``
    (field 3): each batch a ``batches`` entry (field 1) of the group."""
    if not batches:
        raise WireError("a BatchGroup carries at least one batch")
    group: list[bytes | memoryview] = []
    total = 0
    for i, batch in enumerate(batches):
        parts, size = _batch_parts(batch, None if ring_offsets is None else ring_offsets[i])
        head = _GROUP_BATCH + varint(size)
        group.append(head)
        group.extend(parts)
        total += len(head) + size
    return b"".join((_RESPONSE_GROUP, varint(total), *group))


def encode_batches(
    batches: Sequence[NumberedBatch], ring_offsets: Sequence[Mapping[str, int]] | None = None
) -> bytes:
    """The response carrying ``batches``: a lone batch as ``SampleBatch`` (what every client
    reads), several as one ``BatchGroup`` (sent only to clients that asked for groups).
    ``ring_offsets``: each batch's tensor offsets in the stream's ring, whose bytes then stay
    out of the message."""
    if len(batches) == 1:
        return encode_batch_response(batches[0], None if ring_offsets is None else ring_offsets[0])
    return encode_group_response(batches, ring_offsets)
