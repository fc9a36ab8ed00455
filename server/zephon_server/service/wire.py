"""Server side of the wire format: engine :class:`SampleBatch` → ``zephon.v1.SampleBatch``.

Tensors go out in name order as raw little-endian C-order bytes (one ``tobytes`` copy per
tensor; byte order and contiguity fixed by :func:`~zephon_server.engine.digest.wire_array`,
the same view the content digest hashes). Row sources come from each row's ``meta.spans``;
closed documents from the rows' ``closes`` (empty tombstone) then the tombstones' ``closes``
(with their reason); those dropped after a lane's last batch go in its ``EndOfStream``. The
digests are the ones the lane output log assigned.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from zephon_proto.v1 import data_service_pb2 as pb

from ..engine.digest import wire_array
from ..engine.errors import ZephonError
from ..engine.records import SampleBatch, SampleMeta

# numpy (kind, itemsize) → wire dtype; byte order is normalised by wire_array.
_DTYPES: dict[tuple[str, int], pb.DType] = {
    ("i", 4): pb.DTYPE_INT32,
    ("i", 8): pb.DTYPE_INT64,
    ("u", 2): pb.DTYPE_UINT16,
    ("u", 4): pb.DTYPE_UINT32,
    ("f", 4): pb.DTYPE_FLOAT32,
    ("b", 1): pb.DTYPE_BOOL,
    ("u", 1): pb.DTYPE_UINT8,
}

SUPPORTED_DTYPES = ("int32", "int64", "uint16", "uint32", "float32", "bool", "uint8")
DIGEST_SIZE = 32


class WireError(ZephonError, ValueError):
    """An engine object cannot be put on the wire (unsupported dtype, unassigned seq...)."""


def wire_dtype(name: str, dtype: np.dtype) -> pb.DType:
    """The ``DType`` value of a numpy dtype; :class:`WireError` naming the tensor otherwise."""
    code = _DTYPES.get((dtype.kind, dtype.itemsize))
    if code is None:
        raise WireError(
            f"tensor {name!r} has dtype {dtype}, which the wire does not carry; "
            f"supported: {', '.join(SUPPORTED_DTYPES)} (cast it in the pipeline)"
        )
    return code


def tensor_to_proto(name: str, arr: np.ndarray) -> pb.Tensor:
    """One tensor as raw little-endian C-order bytes with its dtype and shape."""
    out = pb.Tensor()
    fill_tensor(out, name, arr)
    return out


def fill_tensor(out: pb.Tensor, name: str, arr: np.ndarray) -> None:
    """Write a tensor into ``out`` (a field of the batch, so the bytes are copied in once).

    The shape is the wire array's (so it matches what the content digest hashed).
    """
    code = wire_dtype(name, arr.dtype)
    wire = wire_array(arr)
    out.name = name
    out.dtype = code
    out.shape.extend(wire.shape)
    out.data = wire.tobytes()


def check_sendable(batch: SampleBatch) -> None:
    """:class:`WireError` unless the lane output log assigned the batch's seq and digests."""
    if batch.seq < 0:
        raise WireError(
            f"lane {batch.lane_id}: batch has no seq; only batches from the lane output log "
            "(which assigns seq and digests) go on the wire"
        )
    for what, value in (("digest", batch.digest), ("chain_digest", batch.chain_digest)):
        if len(value) != DIGEST_SIZE:
            raise WireError(
                f"lane {batch.lane_id} seq {batch.seq}: {what} has {len(value)} bytes, "
                f"expected {DIGEST_SIZE} (assigned by the lane output log)"
            )


def batch_to_proto(batch: SampleBatch) -> pb.SampleBatch:
    """The batch as a ``zephon.v1.SampleBatch`` message (seq and digests must be assigned).

    The service sends :func:`~zephon_server.service.encoding.encode_batch_response`'s bytes,
    which are this message's serialization made without building it."""
    check_sendable(batch)
    msg = pb.SampleBatch(
        lane=batch.lane_id,
        seq=batch.seq,
        digest=batch.digest,
        chain_digest=batch.chain_digest,
    )
    for name in sorted(batch.tensors):
        fill_tensor(msg.tensors.add(), name, batch.tensors[name])
    for meta in batch.rows:
        row = msg.rows.add()
        for span in meta.spans:
            doc = span.doc
            row.segments.add(
                dataset=doc.dataset,
                shard=doc.shard,
                row=doc.row,
                epoch=doc.epoch,
                start=span.start,
                length=span.length,
            )
    for meta in batch.rows:
        for doc in meta.closes:
            msg.closed.add(dataset=doc.dataset, shard=doc.shard, row=doc.row, epoch=doc.epoch)
    add_tombstones(msg.closed, batch.tombstones)
    return msg


def add_tombstones(closed: Any, tombstones: Iterable[SampleMeta]) -> None:
    """Append the documents the dropped records close, with the reason, to a ``closed`` field."""
    for meta in tombstones:
        for doc in meta.closes:
            closed.add(
                dataset=doc.dataset,
                shard=doc.shard,
                row=doc.row,
                epoch=doc.epoch,
                tombstone=meta.tombstone,
            )


def batch_response(batch: SampleBatch) -> pb.StreamBatchesResponse:
    """A ``StreamBatchesResponse`` carrying the batch."""
    return pb.StreamBatchesResponse(batch=batch_to_proto(batch))


def end_response(
    next_seq: int, chain_digest: bytes, tombstones: Iterable[SampleMeta] = ()
) -> pb.StreamBatchesResponse:
    """The explicit end of a lane: its final position, last chain digest, and the documents
    closed by records dropped after its last batch."""
    end = pb.EndOfStream(next_seq=next_seq, chain_digest=chain_digest)
    add_tombstones(end.closed, tombstones)
    return pb.StreamBatchesResponse(end=end)
