"""A lane batch's ``StreamBatchesResponse`` bytes, encoded by hand.

:func:`encode_batch_response` returns exactly ``wire.batch_response(batch).SerializeToString()``
(fields in number order, proto3 zero values left out, minimal varints, so the bytes are the
ones protobuf writes; ``tests/test_wire.py`` checks that on every kind of batch) without
building the message: the tensor bytes are copied once, straight from the arrays, and each
document's identity is encoded once per batch although it appears both in a row source and
among the closed documents; varints below 2**14 come from a table. On the benchmark's
batches (8 x 2048 tokens, ~40 row segments and ~40 closed documents) that is ~95 µs of CPU
per batch against ~150 µs to build and serialize the message, plus ~25 µs for the bytes-sent
metric's second serialization, which now reads the length. ``python -m bench.delivery``
measures both. On a stream with a shared-memory ring (:mod:`.ring`) a tensor's header carries
``ring_offset`` instead of the bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from zephon_wire import wire_array

from ..engine.records import DocRef, SampleBatch, SampleMeta
from .wire import WireError, check_sendable, wire_dtype

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


def _len_field(tag: bytes, body: bytes) -> bytes:
    return tag + varint(len(body)) + body


def _doc_fields(doc: DocRef) -> bytes:
    """``dataset``, ``shard``, ``row``, ``epoch``: fields 1-4 of both Segment and ClosedDocument."""
    dataset, shard, row, epoch = doc
    out = b"\x08" + varint(dataset) if dataset else b""
    if shard:
        out += b"\x10" + varint(shard)
    if row:
        out += b"\x18" + varint(row)
    if epoch:
        out += b"\x20" + varint(epoch)
    return out


_EMPTY = memoryview(b"")


class _Docs(dict[DocRef, bytes]):
    """Each document's encoded identity, made once per batch."""

    def __missing__(self, doc: DocRef) -> bytes:
        fields = self[doc] = _doc_fields(doc)
        return fields


def _tensor(name: str, arr: np.ndarray, ring_offset: int | None) -> tuple[bytes, memoryview]:
    """A ``Tensor`` field of SampleBatch (field 3): its header, then the data to append (none
    when the bytes are in the stream's ring at ``ring_offset``)."""
    code = wire_dtype(name, arr.dtype)
    wire = wire_array(arr)  # shape included: a 0-d array travels as shape [1]
    shape = b"".join(varint(n) for n in wire.shape)
    head = b"".join(
        (
            _len_field(b"\x0a", name.encode()) if name else b"",
            b"\x10" + varint(code) if code else b"",
            _len_field(b"\x1a", shape) if shape else b"",
        )
    )
    if ring_offset is not None:
        head += b"\x28" + varint(ring_offset)
        return b"\x1a" + varint(len(head)) + head, _EMPTY
    if not wire.nbytes:
        return b"\x1a" + varint(len(head)) + head, _EMPTY
    head += b"\x22" + varint(wire.nbytes)
    return b"\x1a" + varint(len(head) + wire.nbytes) + head, wire.data.cast("B")


def closed_fields(docs: _Docs, metas: Iterable[SampleMeta], *, tombstones: bool) -> list[bytes]:
    """``ClosedDocument`` fields (tag 7 in SampleBatch): each meta's ``closes``, with the meta's
    tombstone reason when ``tombstones``."""
    out = []
    for meta in metas:
        reason = b""
        if tombstones and meta.tombstone:
            reason = _len_field(b"\x2a", meta.tombstone.encode())
        for doc in meta.closes:
            body = docs[doc] + reason
            out.append(b"\x3a" + varint(len(body)) + body)
    return out


def _batch_parts(
    batch: SampleBatch, ring_offsets: Mapping[str, int] | None = None
) -> tuple[list[bytes | memoryview], int]:
    """A ``SampleBatch`` message's fields, in number order, and their total size; tensors in
    the stream's ring when ``ring_offsets`` (name → offset) is given."""
    check_sendable(batch)
    docs = _Docs()
    parts: list[bytes | memoryview] = [
        b"\x08" + varint(batch.lane_id) if batch.lane_id else b"",
        b"\x10" + varint(batch.seq) if batch.seq else b"",
    ]
    for name in sorted(batch.tensors):
        offset = None if ring_offsets is None else ring_offsets[name]
        parts.extend(_tensor(name, batch.tensors[name], offset))
    for meta in batch.rows:
        segments = []
        for doc, start, length in meta.spans:
            body = docs[doc]
            if start:
                body += b"\x28" + varint(start)
            if length:
                body += b"\x30" + varint(length)
            segments.append(b"\x0a" + varint(len(body)) + body)
        parts.append(_len_field(b"\x22", b"".join(segments)))
    parts.append(b"\x2a\x20" + batch.digest)
    parts.append(b"\x32\x20" + batch.chain_digest)
    parts.extend(closed_fields(docs, batch.rows, tombstones=False))
    parts.extend(closed_fields(docs, batch.tombstones, tombstones=True))
    return parts, sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def encode_batch_response(
    batch: SampleBatch, ring_offsets: Mapping[str, int] | None = None
) -> bytes:
    """The serialized ``StreamBatchesResponse`` carrying ``batch`` (see the module docstring)."""
    parts, size = _batch_parts(batch, ring_offsets)
    return b"".join((b"\x0a", varint(size), *parts))


def encode_group_response(
    batches: Sequence[SampleBatch], ring_offsets: Sequence[Mapping[str, int]] | None = None
) -> bytes:
    """The serialized ``StreamBatchesResponse`` carrying ``batches`` in one ``BatchGroup``
    (field 3): each batch a ``batches`` entry (field 1) of the group."""
    if not batches:
        raise WireError("a BatchGroup carries at least one batch")
    group: list[bytes | memoryview] = []
    total = 0
    for i, batch in enumerate(batches):
        parts, size = _batch_parts(batch, None if ring_offsets is None else ring_offsets[i])
        head = b"\x0a" + varint(size)
        group.append(head)
        group.extend(parts)
        total += len(head) + size
    return b"".join((b"\x1a", varint(total), *group))


def encode_batches(
    batches: Sequence[SampleBatch], ring_offsets: Sequence[Mapping[str, int]] | None = None
) -> bytes:
    """The response carrying ``batches``: a lone batch as ``SampleBatch`` (what every client
    reads), several as one ``BatchGroup`` (sent only to clients that asked for groups).
    ``ring_offsets``: each batch's tensor offsets in the stream's ring (:mod:`.ring`), whose
    bytes then stay out of the message."""
    if len(batches) == 1:
        return encode_batch_response(batches[0], None if ring_offsets is None else ring_offsets[0])
    return encode_group_response(batches, ring_offsets)
