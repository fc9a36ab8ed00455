"""The oracle of the hand-written encoder: a batch's message built with protobuf.

The service sends :mod:`zephon_server.service.encoding`'s bytes; the tests check them against
the serialization of the message this module builds field by field with the generated
protobuf classes (slow, obviously right). It lives with the test utilities because nothing in
the product needs it; the reliability scenarios (run by tools too) use it as their reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.service.wire import add_tombstones, wire_dtype
from zephon_wire import wire_array


def fill_tensor(out: pb.Tensor, name: str, arr: np.ndarray) -> None:
    """Write a tensor into ``out``: raw little-endian C-order bytes, dtype and wire shape."""
    code = wire_dtype(name, arr.dtype)
    wire = wire_array(arr)
    out.name = name
    out.dtype = code  # type: ignore[assignment]
    out.shape.extend(wire.shape)
    out.data = wire.tobytes()


def batch_to_proto(batch: Any) -> pb.SampleBatch:
    """The numbered batch as a ``zephon.v1.SampleBatch`` message."""
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


def batch_response(batch: Any) -> pb.StreamBatchesResponse:
    """A ``StreamBatchesResponse`` carrying the batch."""
    return pb.StreamBatchesResponse(batch=batch_to_proto(batch))
