"""Server side of the wire format: the dtype check and the end of a lane's stream.

Batches are encoded by hand (:mod:`.encoding`), with the dtype codes and the wire view of
:mod:`zephon_wire`. Closed documents of records dropped after a lane's last batch go in its
``EndOfStream`` (built here with protobuf: one small message per stream).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_wire import SUPPORTED_DTYPES, dtype_code

from ..engine.errors import ZephonError
from ..engine.records import SampleMeta

__all__ = [
    "SUPPORTED_DTYPES",
    "WireError",
    "add_tombstones",
    "end_response",
    "wire_dtype",
]


class WireError(ZephonError, ValueError):
    """An engine object cannot be put on the wire (an unsupported dtype, a negative value)."""


def wire_dtype(name: str, dtype: np.dtype) -> int:
    """The ``DType`` value of a numpy dtype; :class:`WireError` naming the tensor otherwise."""
    code = dtype_code(dtype)
    if code is None:
        raise WireError(
            f"tensor {name!r} has dtype {dtype}, which the wire does not carry; "
            f"supported: {', '.join(SUPPORTED_DTYPES)} (cast it in the pipeline)"
        )
    return code


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


def end_response(
    next_seq: int, chain_digest: bytes, tombstones: Iterable[SampleMeta] = ()
) -> pb.StreamBatchesResponse:
    """The explicit end of a lane: its final position, last chain digest, and the documents
    closed by records dropped after its last batch."""
    end = pb.EndOfStream(next_seq=next_seq, chain_digest=chain_digest)
    add_tombstones(end.closed, tombstones)
    return pb.StreamBatchesResponse(end=end)
