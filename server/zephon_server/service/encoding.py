"""A lane batch's ``StreamBatchesResponse`` bytes, encoded by hand.

:func:`encode_batch_response` returns exactly ``wire.batch_response(batch).SerializeToString()``
(fields in number order, proto3 zero values left out, minimal varints, so the bytes are the
ones protobuf writes; ``tests/test_wire.py`` checks that on every kind of batch) without
building the message: the tensor bytes are copied once, straight from the arrays, and each
document's identity is encoded once per batch although it appears both in a row source and
among the closed documents. On the benchmark's batches (8 x 2048 tokens, ~43 row segments and
~43 closed documents) that is ~105 µs of CPU per batch against ~150 µs to build and serialize
the message, plus ~25 µs for the bytes-sent metric's second serialization, which now reads the
length. ``python -m bench.delivery`` measures both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..engine.digest import wire_array
from ..engine.records import DocRef, SampleBatch, SampleMeta
from .wire import WireError, check_sendable, wire_dtype

_SMALL = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """``value`` as a protobuf base-128 varint (unsigned fields only)."""
    if value < 128:
        if value < 0:
            raise WireError(f"cannot encode {value} in an unsigned protobuf field")
        return _SMALL[value]
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
    return b"".join(
        (
            b"\x08" + varint(dataset) if dataset else b"",
            b"\x10" + varint(shard) if shard else b"",
            b"\x18" + varint(row) if row else b"",
            b"\x20" + varint(epoch) if epoch else b"",
        )
    )


class _Docs(dict[DocRef, bytes]):
    """Each document's encoded identity, made once per batch."""

    def __missing__(self, doc: DocRef) -> bytes:
        fields = self[doc] = _doc_fields(doc)
        return fields


def _tensor(name: str, arr: np.ndarray) -> tuple[bytes, memoryview]:
    """A ``Tensor`` field of SampleBatch (field 3): its header, then the data to append."""
    code = wire_dtype(name, arr.dtype)
    wire = wire_array(arr)
    shape = b"".join(varint(n) for n in wire.shape)
    data = wire.data.cast("B") if wire.nbytes else memoryview(b"")
    head = b"".join(
        (
            _len_field(b"\x0a", name.encode()) if name else b"",
            b"\x10" + varint(code) if code else b"",
            _len_field(b"\x1a", shape) if shape else b"",
            b"\x22" + varint(wire.nbytes) if wire.nbytes else b"",
        )
    )
    return b"\x1a" + varint(len(head) + wire.nbytes) + head, data


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


def _batch_parts(batch: SampleBatch) -> tuple[list[bytes | memoryview], int]:
    """A ``SampleBatch`` message's fields, in number order, and their total size."""
    check_sendable(batch)
    docs = _Docs()
    parts: list[bytes | memoryview] = [
        b"\x08" + varint(batch.lane_id) if batch.lane_id else b"",
        b"\x10" + varint(batch.seq) if batch.seq else b"",
    ]
    for name in sorted(batch.tensors):
        parts.extend(_tensor(name, batch.tensors[name]))
    for meta in batch.rows:
        segments = []
        for doc, start, length in meta.spans:
            body = b"".join(
                (
                    docs[doc],
                    b"\x28" + varint(start) if start else b"",
                    b"\x30" + varint(length) if length else b"",
                )
            )
            segments.append(b"\x0a" + varint(len(body)) + body)
        parts.append(_len_field(b"\x22", b"".join(segments)))
    parts.append(b"\x2a\x20" + batch.digest)
    parts.append(b"\x32\x20" + batch.chain_digest)
    parts.extend(closed_fields(docs, batch.rows, tombstones=False))
    parts.extend(closed_fields(docs, batch.tombstones, tombstones=True))
    return parts, sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def encode_batch_response(batch: SampleBatch) -> bytes:
    """The serialized ``StreamBatchesResponse`` carrying ``batch`` (see the module docstring)."""
    parts, size = _batch_parts(batch)
    return b"".join((b"\x0a", varint(size), *parts))


def encode_group_response(batches: Sequence[SampleBatch]) -> bytes:
    """The serialized ``StreamBatchesResponse`` carrying ``batches`` in one ``BatchGroup``
    (field 3): each batch a ``batches`` entry (field 1) of the group."""
    if not batches:
        raise WireError("a BatchGroup carries at least one batch")
    group: list[bytes | memoryview] = []
    total = 0
    for batch in batches:
        parts, size = _batch_parts(batch)
        head = b"\x0a" + varint(size)
        group.append(head)
        group.extend(parts)
        total += len(head) + size
    return b"".join((b"\x1a", varint(total), *group))


def encode_batches(batches: Sequence[SampleBatch]) -> bytes:
    """The response carrying ``batches``: a lone batch as ``SampleBatch`` (what every client
    reads), several as one ``BatchGroup`` (sent only to clients that asked for groups)."""
    if len(batches) == 1:
        return encode_batch_response(batches[0])
    return encode_group_response(batches)
