"""``batch``: group a lane's records into a :class:`SampleBatch` of padded tensors.

Rows of different lengths are padded to the longest row of the batch (``input_ids`` with the
tokenizer's pad id, ``labels`` with -100, everything else with 0) and a boolean
``padding_mask`` marks real tokens. A row without ``loss_mask`` in a batch whose other rows
have one gets ones on its real tokens (pretraining text: every token is trained), zeros on
the padding a ``pack_flat`` row carries. Per-row tensors that are not
aligned with the tokens (:data:`~.trainer_tensors.ROW_TENSORS`: ``cu_seqlens``,
``num_docs``, ``max_seqlen``) are stacked as they are into ``[B, ...]``; they must have one
shape in every row. Tombstones do not take a row: they ride along with the next batch of their
lane so every document's closing is visible in the output.

With ``drop_last=True`` (the default) the accumulator never emits a partial batch: at a flush
sentinel it *stalls* (the only operator allowed to), and at the end of a lane the partial
rows become tombstones (reason ``dropped_last``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError, ContractError
from ..records import SampleBatch
from .accumulators import Accumulator, CountingAccumulator, MicroBatch
from .base import OpContext, Operator, OpTraits
from .trainer_tensors import ROW_TENSORS

PAD_VALUES = {"labels": -100}


class BatchAccumulator(CountingAccumulator):
    """Counting accumulator for batches: tombstones ride along, chunk-aware epoch reset."""

    def __init__(self, max_batch: int, drop_last: bool, max_latency_ms: float | None = None):
        super().__init__(max_batch, max_latency_ms)
        self.drop_last = drop_last

    def _counts(self, elem: Any) -> bool:
        return not elem.meta.tombstone

    def try_epoch_reset(self, boundary_chunk_id: int, lane_id: int) -> bool:
        """Release once every record from before the boundary has left the buffer."""
        return all(e.meta.chunk_id >= boundary_chunk_id for e in self.pending(lane_id))

    def _drop_partials(self, groups: list[MicroBatch]) -> list[MicroBatch]:
        if not self.drop_last:
            return groups
        return [
            [e if e.meta.tombstone else e.tombstone("dropped_last") for e in group]
            for group in groups
        ]

    def end_lane(self, lane_id: int) -> list[MicroBatch]:
        return self._drop_partials(super().flush(reset=True, lane_id=lane_id))

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        groups = super().flush(reset=reset, lane_id=lane_id)
        return groups if lane_id is not None else self._drop_partials(groups)

    def poll(self, now: float | None = None) -> list[MicroBatch]:
        return [] if self.drop_last else super().poll(now)


def pad_rows(name: str, rows: Sequence[np.ndarray], length: int, pad_id: int) -> np.ndarray:
    """Stack 1-D rows into ``[len(rows), length]``, padding each row on the right."""
    dtype = rows[0].dtype if rows else np.int32
    full = (length,)
    if rows and all(row.shape == full and row.dtype == dtype for row in rows):
        return np.concatenate(rows).reshape(len(rows), length)  # rows already padded
    fill = pad_id if name == "input_ids" else PAD_VALUES.get(name, 0)
    out = np.full((len(rows), length), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def row_values(name: str, rows: Sequence[Any]) -> list[np.ndarray]:
    """Every row's ``name`` tensor. A row without ``loss_mask`` among rows with one gets ones
    on its real tokens (pretraining text: every token trained) and zeros on the padding a
    ``pack_flat`` row already carries (its ``padding_mask``); any other tensor missing from a
    row is an error."""
    values = [r.payload.get(name) for r in rows]
    missing = [i for i, v in enumerate(values) if v is None]
    if not missing:
        return values
    having = next(r for r, v in zip(rows, values, strict=True) if v is not None)
    if name != "loss_mask":
        raise ContractError(
            f"operator 'batch': row {rows[missing[0]].meta.cursor} has no {name!r} tensor but "
            f"row {having.meta.cursor} has one; every row of a batch needs the same tensors"
        )
    dtype = having.payload[name].dtype
    for i in missing:
        real = rows[i].payload.get("padding_mask")
        if real is None:
            values[i] = np.ones(len(rows[i].payload["input_ids"]), dtype=dtype)
        else:
            values[i] = np.asarray(real).astype(dtype)
    return values


def stack_rows(name: str, rows: Sequence[np.ndarray]) -> np.ndarray:
    """Stack per-row tensors of one shape into ``[len(rows), *shape]`` (ContractError else)."""
    shapes = {row.shape for row in rows}
    if len(shapes) > 1:
        raise ContractError(
            f"operator 'batch': per-row tensor {name!r} has different shapes in one batch "
            f"({sorted(shapes)}); every row must give it the same shape"
        )
    return np.stack(rows)


class Batch(Operator):
    """Groups ``microbatch_size`` records of one lane into a padded :class:`SampleBatch`."""

    op_name = "batch"
    default_parallelism = 0  # cheap next to tokenizing: runs in its driver thread

    def __init__(
        self,
        *,
        microbatch_size: int = 8,
        drop_last: bool = True,
        pad_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(microbatch_size, int) or microbatch_size < 1:
            raise ConfigError(
                f"batch: microbatch_size must be an integer >= 1, got {microbatch_size!r}"
            )
        if not isinstance(drop_last, bool):
            raise ConfigError(f"batch: drop_last must be true or false, got {drop_last!r}")
        super().__init__(microbatch_size=microbatch_size, **kwargs)
        self.drop_last = drop_last
        self.pad_id = pad_id

    def params(self) -> dict[str, Any]:
        return {
            "microbatch_size": self.microbatch_size,
            "drop_last": self.drop_last,
            "pad_id": self.pad_id,
        }

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, fusable=False)

    def stalls_at_sentinel(self) -> bool:
        # The spec's one stalling operator: a partial batch cannot be emitted at a sentinel.
        return self.drop_last

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return BatchAccumulator(
            self.microbatch_size,
            self.drop_last,
            max_latency_ms=None if deterministic else self.max_latency_ms,
        )

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._pad = self.pad_id if self.pad_id is not None else ctx.pad_id

    def run_many(self, elems: Sequence[Any]) -> list[Any]:
        # Tombstones are part of the batch (its closing list), so no tombstone splitting here.
        return self._checked(self.process_many(list(elems)))

    def process_many(self, elems: list[Any]) -> list[Any]:
        rows = [e for e in elems if not e.meta.tombstone]
        tombstones = tuple(e.meta for e in elems if e.meta.tombstone)
        lane = elems[0].meta.lane_id
        tensors: dict[str, np.ndarray] = {}
        if rows:
            names = sorted(
                {k for r in rows for k, v in r.payload.items() if isinstance(v, np.ndarray)}
            )
            length = max(len(r.payload["input_ids"]) for r in rows)
            for name in names:
                values = row_values(name, rows)
                if name in ROW_TENSORS:
                    tensors[name] = stack_rows(name, values)
                else:
                    tensors[name] = pad_rows(name, values, length, self._pad)
            if "padding_mask" not in tensors:
                mask = np.zeros((len(rows), length), dtype=np.bool_)
                for i, r in enumerate(rows):
                    mask[i, : len(r.payload["input_ids"])] = True
                tensors["padding_mask"] = mask
        return [SampleBatch(lane, tensors, tuple(r.meta for r in rows), tombstones)]
