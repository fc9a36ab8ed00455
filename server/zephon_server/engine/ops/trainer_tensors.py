"""Trainer tensors of a packed row: next-token ``labels`` and variable-length attention metadata.

What the packers (``pack_sequences``, ``pack_flat``) add on request, computed from the row the
packer itself assembled, never from token ids (an EOS id is not a document boundary):

* ``labels`` (``emit_labels``; int32, aligned with ``input_ids``): ``labels[p] =
  input_ids[p + 1]`` when position ``p + 1`` is in the same segment as ``p`` (the same document
  piece, ``segment_ids`` equal and non-zero) and is trained (``loss_mask[p + 1] == 1``, or the
  row has no ``loss_mask``: pretraining text, every token trained); else ``ignore_index``. So a
  piece's last position, padding and untrained targets are ignored. A document cut across rows
  (``wrap``, or ``oversized: split``) gives a piece whose last position has its target in the
  next row: that position is ignored too (one target lost per cut; the next row's piece starts
  a fresh context anyway).
* ``cu_seqlens`` (``emit_cu_seqlens``; int32 ``[max_docs_per_row + 1]``): ``0`` then the
  cumulative lengths of the row's segments; after the last real entry the final value repeats,
  so the row keeps a fixed shape. Padding is *not* a segment: ``cu_seqlens[num_docs]`` is the
  number of real tokens (``padding_mask.sum()``), which is what a varlen kernel needs once the
  padding is removed (``x[padding_mask]``), see docs/post-training.md.
* ``num_docs`` (int32 scalar per row): segments in the row (``segment_ids.max()``).
* ``max_seqlen`` (int32 scalar per row): the longest segment of the row.

``batch`` stacks the per-row tensors (:data:`ROW_TENSORS`) into ``[B, ...]`` instead of padding
them as token-aligned tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, ContractError

#: Per-row tensors (not aligned with ``input_ids``): ``batch`` stacks them as they are.
ROW_TENSORS = frozenset({"cu_seqlens", "num_docs", "max_seqlen"})

#: The conventional ignore index (PyTorch's ``cross_entropy`` default).
DEFAULT_IGNORE_INDEX = -100
_INT32_MIN = -(2**31)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class TrainerTensorOptions:
    """Which trainer tensors a packer emits (all off by default: rows unchanged).

    Raises :class:`ConfigError` naming the operator, the field and the value.
    """

    emit_labels: bool = False
    ignore_index: int = DEFAULT_IGNORE_INDEX
    emit_cu_seqlens: bool = False
    max_docs_per_row: int | None = None
    op_name: str = "pack"

    def __post_init__(self) -> None:
        op = self.op_name
        for name in ("emit_labels", "emit_cu_seqlens"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{op}: {name} must be true or false, got {value!r}")
        if not _is_int(self.ignore_index) or not _INT32_MIN <= self.ignore_index < 0:
            raise ConfigError(
                f"{op}: ignore_index must be a negative integer (never a token id), got "
                f"{self.ignore_index!r}; use -100, PyTorch's cross_entropy default"
            )
        if not self.emit_labels and self.ignore_index != DEFAULT_IGNORE_INDEX:
            raise ConfigError(
                f"{op}: ignore_index {self.ignore_index} does nothing without emit_labels "
                "(there are no labels to fill); set emit_labels: true, or drop ignore_index"
            )
        # max_docs_per_row itself is validated by the packer's PackPolicy, which uses it.
        n = self.max_docs_per_row
        if self.emit_cu_seqlens and n is None:
            raise ConfigError(
                f"{op}: emit_cu_seqlens needs max_docs_per_row (cu_seqlens has the fixed shape "
                "[max_docs_per_row + 1]); set max_docs_per_row, e.g. 64"
            )

    @property
    def any(self) -> bool:
        """Whether any tensor is added to the rows."""
        return self.emit_labels or self.emit_cu_seqlens

    def params(self) -> dict[str, Any]:
        """The options that differ from the defaults (so existing fingerprints stay)."""
        out: dict[str, Any] = {}
        if self.emit_labels:
            out["emit_labels"] = True
            out["ignore_index"] = self.ignore_index
        if self.emit_cu_seqlens:
            out["emit_cu_seqlens"] = True
        if self.max_docs_per_row is not None:
            out["max_docs_per_row"] = self.max_docs_per_row
        return out

    def tensor_names(self) -> tuple[str, ...]:
        """Names of the tensors these options add."""
        names: tuple[str, ...] = ("labels",) if self.emit_labels else ()
        if self.emit_cu_seqlens:
            names += ("cu_seqlens", "num_docs", "max_seqlen")
        return names


def next_token_labels(
    input_ids: np.ndarray,
    segment_ids: np.ndarray,
    loss_mask: np.ndarray | None,
    ignore_index: int,
) -> np.ndarray:
    """``labels`` of one row (see the module docstring); int32, same length as ``input_ids``."""
    labels = np.full(len(input_ids), ignore_index, dtype=np.int32)
    if len(input_ids) < 2:
        return labels
    nxt = segment_ids[1:]
    keep = (nxt == segment_ids[:-1]) & (nxt != 0)
    if loss_mask is not None:
        keep &= loss_mask[1:] != 0
    labels[:-1][keep] = input_ids[1:][keep]
    return labels


def varlen_metadata(lengths: Sequence[int], max_docs: int) -> dict[str, np.ndarray]:
    """``cu_seqlens``, ``num_docs`` and ``max_seqlen`` of a row whose segments have
    ``lengths`` tokens (in row order). Raises ContractError for more than ``max_docs``."""
    count = len(lengths)
    if count > max_docs:
        raise ContractError(
            f"a packed row has {count} documents but max_docs_per_row is {max_docs}; the packer "
            "must close a bin at max_docs_per_row pieces"
        )
    cu = np.zeros(max_docs + 1, dtype=np.int32)
    if count:
        cu[1 : count + 1] = np.cumsum(lengths, dtype=np.int64)
        cu[count + 1 :] = cu[count]
    return {
        "cu_seqlens": cu,
        "num_docs": np.array(count, dtype=np.int32),
        "max_seqlen": np.array(max(lengths, default=0), dtype=np.int32),
    }


def add_trainer_tensors(
    row: dict[str, np.ndarray],
    lengths: Sequence[int],
    options: TrainerTensorOptions,
) -> dict[str, np.ndarray]:
    """The row with the tensors ``options`` ask for added (``lengths``: its segments')."""
    if options.emit_labels:
        row["labels"] = next_token_labels(
            row["input_ids"], row["segment_ids"], row.get("loss_mask"), options.ignore_index
        )
    if options.emit_cu_seqlens:
        assert options.max_docs_per_row is not None  # validated
        row.update(varlen_metadata(lengths, options.max_docs_per_row))
    return row
