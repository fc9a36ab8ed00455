"""Client side of the wire format: ``zephon.v1.SampleBatch`` messages to numpy, and digests.

Tensors travel as raw little-endian C-order bytes with a dtype and a shape; they are decoded
with :func:`numpy.frombuffer`, so the arrays share the message's bytes (and are read-only).

Every batch carries a content digest and a per-lane chain digest. :func:`verify` recomputes
both from the received tensors so a trainer can prove that the stream it read (across
reconnects and resumes) is the uninterrupted one:

``content = sha256(for each tensor in name order: name, dtype, shape, raw bytes)`` and
``chain[k] = sha256(chain[k-1] || content[k])``: both are defined once, in :mod:`zephon_wire`
(numpy and the standard library only), which the server uses too.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_wire import CHAIN_SEED, DTYPES, chain_digest, content_digest

__all__ = [
    "CHAIN_SEED",
    "DTYPES",
    "ChainMismatch",
    "ClosedDocument",
    "DecodedBatch",
    "LaneEnd",
    "Segment",
    "WireError",
    "chain_digest",
    "content_digest",
    "decode_batch",
    "decode_closed",
    "decode_end",
    "decode_tensor",
    "verify",
]


class WireError(ValueError):
    """A message does not follow the wire format (unknown dtype, size and shape disagree...)."""


class ChainMismatch(ValueError):
    """A batch's digests do not match its tensors or the lane's previous chain digest.

    ``expected`` is what the client computed, ``found`` what the batch carries.
    """

    def __init__(self, lane: int, seq: int, what: str, expected: bytes, found: bytes) -> None:
        self.lane = lane
        self.seq = seq
        self.expected = expected
        self.found = found
        super().__init__(
            f"lane {lane} seq {seq}: {what} mismatch: computed {expected.hex()}, "
            f"batch carries {found.hex()}"
        )


class Segment(NamedTuple):
    """Tokens ``[start, start + length)`` of document ``(dataset, shard, row, epoch)`` in a row."""

    dataset: int
    shard: int
    row: int
    epoch: int
    start: int
    length: int


class ClosedDocument(NamedTuple):
    """A document a batch closes; ``tombstone`` is empty if delivered, else why it was dropped."""

    dataset: int
    shard: int
    row: int
    epoch: int
    tombstone: str


class DecodedBatch:
    """One lane batch as numpy arrays plus its provenance and digests.

    ``lane``, ``seq``, ``tensors`` (name → read-only numpy array), ``rows`` (each row's
    :class:`Segment` list), ``closed`` (:class:`ClosedDocument` list), ``digest`` and
    ``chain_digest``. A batch decoded from a message (``source``) decodes ``rows`` and
    ``closed`` on first access, since most trainers never read them; until then it keeps the
    message.
    """

    __slots__ = ("_closed", "_rows", "_source", "chain_digest", "digest", "lane", "seq", "tensors")

    def __init__(
        self,
        lane: int,
        seq: int,
        tensors: dict[str, np.ndarray],
        rows: list[list[Segment]] | None = None,
        closed: list[ClosedDocument] | None = None,
        digest: bytes = b"",
        chain_digest: bytes = b"",
        *,
        source: pb.SampleBatch | None = None,
    ) -> None:
        self.lane = lane
        self.seq = seq
        self.tensors = tensors
        self.digest = digest
        self.chain_digest = chain_digest
        self._rows = rows if rows is not None or source is not None else []
        self._closed = closed if closed is not None or source is not None else []
        self._source = source

    @property
    def rows(self) -> list[list[Segment]]:
        """Each row's segments: which document's tokens ``[start, start + length)`` it holds."""
        if self._rows is None:
            assert self._source is not None
            self._rows = [
                [
                    Segment(s.dataset, s.shard, s.row, s.epoch, s.start, s.length)
                    for s in row.segments
                ]
                for row in self._source.rows
            ]
            self._release()
        return self._rows

    @property
    def closed(self) -> list[ClosedDocument]:
        """The documents this batch closes (delivered, or dropped with a tombstone)."""
        if self._closed is None:
            assert self._source is not None
            self._closed = decode_closed(self._source.closed)
            self._release()
        return self._closed

    def _release(self) -> None:
        if self._rows is not None and self._closed is not None:
            self._source = None

    @property
    def num_rows(self) -> int:
        """Rows in the batch (the first dimension of its tensors)."""
        return len(self.rows)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name}{list(arr.shape)}" for name, arr in sorted(self.tensors.items()))
        return f"DecodedBatch(lane={self.lane}, seq={self.seq}, tensors=[{shapes}])"


def decode_tensor(tensor: pb.Tensor, ring: mmap.mmap | None = None) -> np.ndarray:
    """The tensor as a read-only numpy array sharing the message's bytes, or over a copy of its
    bytes in the stream's shared-memory ``ring`` when it carries a ``ring_offset``."""
    dtype = DTYPES.get(tensor.dtype)
    if dtype is None:
        raise WireError(
            f"tensor {tensor.name!r}: unsupported dtype {_dtype_name(tensor.dtype)}; "
            f"expected one of {', '.join(pb.DType.Name(k) for k in DTYPES)}"
        )
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise WireError(f"tensor {tensor.name!r}: negative dimension in shape {list(shape)}")
    expected = math.prod(shape) * dtype.itemsize
    if tensor.HasField("ring_offset"):
        data = _from_ring(tensor, ring, expected)
    else:
        data = tensor.data  # each access of a bytes field makes a new bytes object: read once
    if len(data) != expected:
        raise WireError(
            f"tensor {tensor.name!r}: {len(data)} bytes of data, but shape "
            f"{list(shape)} of {pb.DType.Name(tensor.dtype)} needs {expected}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _from_ring(tensor: pb.Tensor, ring: mmap.mmap | None, nbytes: int) -> bytes:
    """A copy of the tensor's bytes in the shared-memory ring (valid only until the batch is
    acknowledged, so never a view)."""
    if ring is None:
        raise WireError(
            f"tensor {tensor.name!r} is in a shared-memory ring, but this stream has none "
            "(the server sent ring_offset without an accepted RingOffer)"
        )
    if tensor.data:
        raise WireError(f"tensor {tensor.name!r} carries both data and ring_offset")
    start = tensor.ring_offset
    if start + nbytes > len(ring):
        raise WireError(
            f"tensor {tensor.name!r}: ring bytes [{start}, {start + nbytes}) beyond the "
            f"ring's {len(ring)}"
        )
    return ring[start : start + nbytes]


def decode_batch(msg: pb.SampleBatch, ring: mmap.mmap | None = None) -> DecodedBatch:
    """Decode a ``SampleBatch`` message: tensors by name now (their bytes copied out of the
    stream's shared-memory ``ring`` where they are there); row sources and closed
    documents when first read (:class:`DecodedBatch` keeps ``msg`` until then: do not
    modify it)."""
    tensors: dict[str, np.ndarray] = {}
    for tensor in msg.tensors:
        if tensor.name in tensors:
            raise WireError(f"lane {msg.lane} seq {msg.seq}: tensor {tensor.name!r} appears twice")
        tensors[tensor.name] = decode_tensor(tensor, ring)
    return DecodedBatch(
        lane=msg.lane,
        seq=msg.seq,
        tensors=tensors,
        digest=msg.digest,
        chain_digest=msg.chain_digest,
        source=msg,
    )


@dataclass(frozen=True, slots=True)
class LaneEnd:
    """The end of a lane as the server sent it (``EndOfStream``).

    ``next_seq`` is one past the lane's last seq, ``chain_digest`` the chain digest of its last
    batch, and ``closed`` the documents closed after that batch (records dropped since, with
    the reason): with every batch's ``closed`` they close each document the lane read once."""

    lane: int
    next_seq: int
    chain_digest: bytes
    closed: list[ClosedDocument] = field(default_factory=list)


def decode_closed(closed: Iterable[pb.ClosedDocument]) -> list[ClosedDocument]:
    """A ``closed`` field as :class:`ClosedDocument` tuples."""
    return [ClosedDocument(c.dataset, c.shard, c.row, c.epoch, c.tombstone) for c in closed]


def decode_end(lane: int, end: pb.EndOfStream) -> LaneEnd:
    """Decode lane ``lane``'s ``EndOfStream`` message."""
    return LaneEnd(lane, end.next_seq, end.chain_digest, decode_closed(end.closed))


def verify(batch: DecodedBatch, previous_chain: bytes) -> None:
    """Check a batch against its tensors and the lane's previous chain digest.

    ``previous_chain`` is the chain digest of the lane's batch ``seq - 1`` (``CHAIN_SEED``
    for seq 0). Raises :class:`ChainMismatch` when the content digest recomputed from the
    received tensors differs from the batch's, or when the batch's chain digest is not
    ``sha256(previous_chain || content)``; the next call passes ``batch.chain_digest``.
    """
    content = content_digest(batch.tensors)
    if content != batch.digest:
        raise ChainMismatch(batch.lane, batch.seq, "content digest", content, batch.digest)
    chain = chain_digest(previous_chain, content)
    if chain != batch.chain_digest:
        raise ChainMismatch(batch.lane, batch.seq, "chain digest", chain, batch.chain_digest)


def _dtype_name(value: int) -> str:
    try:
        return f"{pb.DType.Name(value)} ({value})"
    except ValueError:
        return str(value)
