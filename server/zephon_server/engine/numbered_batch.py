"""A lane's batch once the lane output log numbered it: the value the engine hands on.

Operators make :class:`~.records.SampleBatch` objects (tensors, rows, tombstones) without
knowing where they fall in the lane. The lane output log (:class:`~.run.LaneLog`) numbers each
one exactly once and builds a :class:`NumberedBatch`: seq, the tensors' wire view (little-endian,
C-contiguous, in name order: :func:`zephon_wire.wire_tensors`), the content digest of that
view, the lane's chain digest and the byte size. Everything downstream (the delivery log,
shared-memory rings, the encoder, metrics) reads these fields; nothing normalises, sorts or
sizes a batch again, and nothing can see a batch without its seq and digests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from zephon_wire import DIGEST_SIZE, WireTensors, chain_digest, digest_wire, wire_tensors

from .records import Cursor, DocRef, SampleBatch, SampleMeta, batch_closes, count_tokens


@dataclass(frozen=True, slots=True, eq=False)
class NumberedBatch:
    """Batch ``seq`` of lane ``lane_id`` with its digests and wire view (module docstring).

    Build it with :meth:`number`; the constructor checks that seq and digests are set.
    """

    lane_id: int
    seq: int
    tensors: Mapping[str, np.ndarray]
    """The tensors as the pipeline made them (read-only by convention)."""
    rows: tuple[SampleMeta, ...]
    tombstones: tuple[SampleMeta, ...]
    wire: WireTensors
    """The tensors as they travel: ``(name, array)`` in name order, little-endian, contiguous."""
    digest: bytes
    chain_digest: bytes
    nbytes: int
    """Bytes of tensor data (of the wire view)."""

    def __post_init__(self) -> None:
        if self.seq < 0:
            raise ValueError(
                f"NumberedBatch.seq must be >= 0, got {self.seq} (lane {self.lane_id})"
            )
        for what in ("digest", "chain_digest"):
            value = getattr(self, what)
            if len(value) != DIGEST_SIZE:
                raise ValueError(
                    f"NumberedBatch.{what} of lane {self.lane_id} seq {self.seq} has "
                    f"{len(value)} bytes, expected {DIGEST_SIZE}"
                )

    @classmethod
    def number(cls, batch: SampleBatch, seq: int, previous_chain: bytes) -> NumberedBatch:
        """``batch`` as seq ``seq`` of its lane, chained to ``previous_chain`` (the chain
        digest of seq - 1, or ``CHAIN_SEED``): the wire view, digests and size made once."""
        wire = wire_tensors(batch.tensors)
        content = digest_wire(wire)
        return cls(
            batch.lane_id,
            seq,
            batch.tensors,
            batch.rows,
            batch.tombstones,
            wire,
            content,
            chain_digest(previous_chain, content),
            sum(arr.nbytes for _, arr in wire),
        )

    @property
    def cursor(self) -> Cursor:
        """Cursor of the batch's last row."""
        return self.rows[-1].cursor if self.rows else ()

    def closes(self) -> Iterable[DocRef]:
        """Every document this batch closes (rows and tombstones)."""
        return batch_closes(self.rows, self.tombstones)

    def num_tokens(self) -> int:
        """Non-padding tokens in the batch."""
        return count_tokens(self.tensors)

    def __repr__(self) -> str:
        shapes = {name: tuple(arr.shape) for name, arr in self.wire}
        return (
            f"NumberedBatch(lane={self.lane_id}, seq={self.seq}, rows={len(self.rows)}, {shapes})"
        )
