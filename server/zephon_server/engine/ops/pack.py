"""``pack_sequences`` and ``pack_flat``: pack a lane's tokenized records into rows.

The work is split as the spec page asks. The :class:`PackAccumulator` sees each lane's records
in stream order and makes every stateful decision (which bin a record goes into, when a bin is
emitted; see :mod:`.packing` for the algorithms). What it emits per bin is a *bin plan*: a
record whose payload is ``{"pieces": [(input_payload, start, length), ...]}`` (references to
the input arrays and the token range of each piece) and whose meta is already the packed row's
meta. ``process_many`` then assembles the tensors on the workers, statelessly.

Row meta: ``cursor = first piece's record cursor + (first piece's start,)`` (unique in the lane:
no two rows start with the same piece), ``dataset_id`` of the first piece, ``doc=None``, one
``Span`` per piece, and ``closes`` = the ``closes`` of every input record whose last token is in
the row, in order. Bins, and so rows, are per lane: records of different lanes never share one.

Row payload (``pack_sequences``, unpadded; the length is the tokens used):

* ``input_ids`` (int32), the pieces concatenated in placement order;
* ``segment_ids`` (int32), ``1..n`` numbering the row's pieces (one per document piece);
* ``positions`` (int32), restarting at 0 at each piece. With ``wrap`` a piece that continues a
  record from the previous row keeps counting from its start offset in that record; with
  ``first_fit``/``best_fit`` the pieces of a split oversized record are separate items and
  each restarts at 0 (like the children of ``tokenize(max_length=...)``);
* ``loss_mask`` and ``labels``, when the input payloads carry them aligned with ``input_ids``:
  sliced exactly like ``input_ids``. A record without ``loss_mask`` packed with records that
  have one gets ones (pretraining text: every token is trained); ``labels`` must be on every
  record or none. Other payload fields are not carried.

``pack_flat`` pads every row to exactly ``max_length``: ``input_ids`` with the pad id (the
``pad_id`` parameter, else ``OpContext.pad_id`` from ``setup``), ``positions``/``segment_ids``/
``loss_mask`` with 0, ``labels`` with -100, and adds ``padding_mask`` (bool, True on tokens).

Oversized records (longer than ``max_length``): ``oversized="split"`` cuts them (only the piece
holding the last token closes the record's documents); ``"drop"`` replaces them by a tombstone
with reason ``oversized``. Empty records (no tokens) become tombstones with reason ``empty``.
Tombstones (arriving or made here) pass straight through, in arrival order relative to the rows
emitted by the same ``push_many`` call, without touching any bin.

Trainer tensors (off by default; see :mod:`.trainer_tensors`): ``emit_labels`` adds next-token
``labels`` from the row's own segments and ``loss_mask``; ``emit_cu_seqlens`` adds
``cu_seqlens``/``num_docs``/``max_seqlen`` and needs ``max_docs_per_row``, which also limits
the packing itself (a bin closes at that many pieces). An input that already carries ``labels``
with ``emit_labels`` on is a contract error (two sources of labels).

At a flush sentinel the lane's open bins are emitted (partial; ``pack_flat`` pads them) and the
lane is reset to a fresh state; other lanes are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, ContractError
from ..records import DocRef, SampleMeta, SampleRecord, Span
from .accumulators import Accumulator, MicroBatch
from .base import OpContext, Operator, OpTraits
from .packing import Bin, LaneBins, PackPolicy
from .trainer_tensors import DEFAULT_IGNORE_INDEX, TrainerTensorOptions, add_trainer_tensors

#: Aligned per-token fields carried into packed rows, with their padding value.
CARRIED_FIELDS: dict[str, int] = {"loss_mask": 0, "labels": -100}

TOMBSTONE_OVERSIZED = "oversized"
TOMBSTONE_EMPTY = "empty"


def record_length(rec: SampleRecord, op_name: str = "pack") -> int:
    """Tokens in a record's ``input_ids`` (raises a ContractError when there are none)."""
    payload = rec.payload
    if not isinstance(payload, dict) or "input_ids" not in payload:
        raise ContractError(
            f"operator {op_name!r}: record {rec.meta.cursor} of lane {rec.meta.lane_id} has no "
            "payload['input_ids']; put tokenize before packing"
        )
    return len(payload["input_ids"])


def piece_spans(meta: SampleMeta, start: int, length: int) -> list[Span]:
    """The spans covering tokens ``[start, start + length)`` of a record.

    Tokenized records carry exactly one span, giving ``Span(doc, span.start + start, length)``;
    several spans are sliced in order, and a record without spans falls back to its ``doc``.
    """
    if not meta.spans:
        return [] if meta.doc is None else [Span(meta.doc, start, length)]
    out: list[Span] = []
    end = start + length
    offset = 0
    for span in meta.spans:
        lo, hi = max(start, offset), min(end, offset + span.length)
        if lo < hi:
            out.append(Span(span.doc, span.start + lo - offset, hi - lo))
        offset += span.length
        if offset >= end:
            break
    return out


def plan_record(lane_id: int, bin_: Bin) -> SampleRecord:
    """The bin plan record of an emitted bin (payload: pieces; meta: the packed row's)."""
    first, first_start, _ = bin_.pieces[0]
    spans: list[Span] = []
    closes: dict[DocRef, None] = {}
    pieces = []
    for rec, start, n in bin_.pieces:
        meta = rec.meta
        payload = rec.payload
        own = meta.spans
        if len(own) == 1 and start + n <= own[0].length:
            # A tokenized record's one span (piece_spans' common case, without the loop).
            doc, first_token, _ = own[0]
            spans.append(Span(doc, first_token + start, n))
        else:
            spans.extend(piece_spans(meta, start, n))
        if start + n == len(payload["input_ids"]):
            for doc in meta.closes:
                closes[doc] = None
        pieces.append((payload, start, n))
    row = SampleMeta(
        lane_id,
        (*first.meta.cursor, first_start),
        first.meta.dataset_id,
        None,
        tuple(closes),
        tuple(spans),
    )
    return SampleRecord({"pieces": pieces}, row)


class PackAccumulator(Accumulator):
    """Per-lane bins for the packing operators; emits bin plans (see the module docstring).

    Each ``push_many`` emits, per lane that produced anything, that lane's rows and tombstones
    in order, cut into micro-batches of at most ``max_batch`` (lane-pure). There is no latency
    bound: emission depends only on each lane's input sequence.
    """

    reads_payload = True

    def __init__(self, policy: PackPolicy, *, max_batch: int = 64) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.policy = policy
        self.max_batch = max_batch
        self._lanes: dict[int, LaneBins] = {}

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        policy = self.policy
        drop = policy.oversized == "drop"
        ready: dict[int, list[SampleRecord]] = {}
        for elem in elems:
            meta = elem.meta
            lane = meta.lane_id
            if meta.tombstone:
                ready.setdefault(lane, []).append(elem)
                continue
            payload = elem.payload
            if type(payload) is dict and "input_ids" in payload:
                length = len(payload["input_ids"])
            else:
                length = record_length(elem, policy.op_name)  # raises the contract error
            if length == 0 or (drop and length > policy.max_length):
                reason = TOMBSTONE_EMPTY if length == 0 else TOMBSTONE_OVERSIZED
                ready.setdefault(lane, []).append(elem.tombstone(reason))
                continue
            slot = self._lanes.get(lane)
            if slot is None:
                slot = self._lanes[lane] = LaneBins(policy)
            bins = slot.add(elem, length)
            if bins:
                ready.setdefault(lane, []).extend(plan_record(lane, b) for b in bins)
        return self._cut(ready)

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        """Emit open bins (partial, in opening order) and drop the lane state.

        With ``lane_id`` only that lane is flushed and reset; without, every lane (end of
        stream), lane by lane in lane-id order. Emitting every open bin leaves nothing behind,
        so ``reset`` changes nothing here: the lane is fresh afterwards either way.
        """
        lanes = [lane_id] if lane_id is not None else sorted(self._lanes)
        ready: dict[int, list[SampleRecord]] = {}
        for lane in lanes:
            slot = self._lanes.pop(lane, None)
            if slot is not None and slot.pending:
                ready[lane] = [plan_record(lane, b) for b in slot.drain()]
        return self._cut(ready)

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        if lane_id is not None:
            slot = self._lanes.get(lane_id)
            return slot is not None and slot.pending
        return any(slot.pending for slot in self._lanes.values())

    def lanes_state(self) -> dict[int, int]:
        """Open bins per lane (for tests and metrics)."""
        return {lane: len(slot.bins) for lane, slot in self._lanes.items() if slot.pending}

    def _cut(self, ready: dict[int, list[SampleRecord]]) -> list[MicroBatch]:
        size = self.max_batch
        return [items[i : i + size] for items in ready.values() for i in range(0, len(items), size)]


def assemble_row(
    pieces: Sequence[tuple[dict[str, Any], int, int]],
    *,
    continue_positions: bool,
    pad_to: int | None = None,
    pad_id: int = 0,
    op_name: str = "pack",
) -> dict[str, np.ndarray]:
    """The tensors of one packed row from its bin plan pieces (vectorised per row).

    ``continue_positions``: positions of a piece start at its start offset instead of 0
    (``wrap``). ``pad_to``: pad every tensor to that length and add ``padding_mask``.
    """
    if pad_to is not None:
        padded = _assemble_padded(pieces, continue_positions, pad_to, pad_id)
        if padded is not None:
            return padded
    return _assemble(pieces, continue_positions, pad_to, pad_id, op_name)


def _assemble(
    pieces: Sequence[tuple[dict[str, Any], int, int]],
    continue_positions: bool,
    pad_to: int | None,
    pad_id: int,
    op_name: str,
) -> dict[str, np.ndarray]:
    """:func:`assemble_row` in general: whole-row arrays, carried fields, then padding."""
    count = len(pieces)
    lengths = np.fromiter((n for _, _, n in pieces), dtype=np.int64, count=count)
    total = int(lengths.sum())
    row_offsets = np.cumsum(lengths) - lengths
    if continue_positions:
        row_offsets -= np.fromiter((s for _, s, _ in pieces), dtype=np.int64, count=count)
    positions = np.arange(total, dtype=np.int64) - np.repeat(row_offsets, lengths)
    payload: dict[str, np.ndarray] = {
        "input_ids": np.concatenate([p["input_ids"][s : s + n] for p, s, n in pieces]).astype(
            np.int32, copy=False
        ),
        "positions": positions.astype(np.int32),
        "segment_ids": np.repeat(np.arange(1, count + 1, dtype=np.int32), lengths),
    }
    for name in CARRIED_FIELDS:
        carried = _carried(name, pieces, op_name)
        if carried is not None:
            payload[name] = carried
    if pad_to is None:
        return payload
    padded: dict[str, np.ndarray] = {}
    for name, arr in payload.items():
        fill = pad_id if name == "input_ids" else CARRIED_FIELDS.get(name, 0)
        out = np.full(pad_to, fill, dtype=arr.dtype)
        out[:total] = arr
        padded[name] = out
    padded["padding_mask"] = np.arange(pad_to) < total
    return padded


def _carried(
    name: str, pieces: Sequence[tuple[dict[str, Any], int, int]], op_name: str
) -> np.ndarray | None:
    """The row's ``name`` field from its pieces, or None when no piece carries it.

    A piece without a ``loss_mask`` among pieces with one gets ones: a record without a loss
    mask is pretraining text, every token trained. Any other field must be on every piece.
    """
    present = [name in p for p, _, _ in pieces]
    if not any(present):
        return None
    if not all(present) and name != "loss_mask":
        raise ContractError(
            f"operator {op_name!r}: some packed records carry {name!r} and others do not; "
            f"give every record a {name!r} aligned with its input_ids, or none"
        )
    dtype = next(np.asarray(p[name]).dtype for p, _, _ in pieces if name in p)
    parts = []
    for p, s, n in pieces:
        if name not in p:
            parts.append(np.ones(n, dtype=dtype))
            continue
        arr = np.asarray(p[name])
        if len(arr) != len(p["input_ids"]):
            raise ContractError(
                f"operator {op_name!r}: {name!r} has {len(arr)} entries but input_ids has "
                f"{len(p['input_ids'])}; it must be aligned with input_ids token for token"
            )
        parts.append(arr[s : s + n])
    return np.concatenate(parts)


_CARRIED = frozenset(CARRIED_FIELDS)
_CARRIED_BESIDE_MASK = _CARRIED - {"loss_mask"}  # a masked piece with any of these: general path
_RAMP = np.arange(1 << 16, dtype=np.int32)
"""Positions ``0, 1, 2, ...`` sliced by :func:`_assemble_padded` (longer runs use ``arange``)."""


def _assemble_padded(
    pieces: Sequence[tuple[dict[str, Any], int, int]],
    continue_positions: bool,
    pad_to: int,
    pad_id: int,
) -> dict[str, np.ndarray] | None:
    """:func:`assemble_row` for a padded row whose pieces carry no field but, all of them, a
    ``loss_mask`` of one dtype (``render_chat``'s records) or nothing at all (``tokenize``'s):
    each piece is written into the preallocated row tensors (a few slice assignments per piece
    instead of building, concatenating and then padding whole-row arrays); the tensors are
    the same. ``None`` for any other row (the general assembly handles those)."""
    head = pieces[0][0].get("loss_mask")
    mask_dtype = head.dtype if type(head) is np.ndarray else None
    input_ids = np.full(pad_to, pad_id, dtype=np.int32)
    positions = np.zeros(pad_to, dtype=np.int32)
    segment_ids = np.zeros(pad_to, dtype=np.int32)
    loss_mask = None if mask_dtype is None else np.zeros(pad_to, dtype=mask_dtype)
    end = 0
    for segment, (payload, start, n) in enumerate(pieces, 1):
        ids = payload["input_ids"]
        if loss_mask is None:
            if not _CARRIED.isdisjoint(payload):
                return None
        else:
            mask: Any = payload.get("loss_mask")
            if (
                type(mask) is not np.ndarray
                or mask.ndim != 1
                or mask.dtype != mask_dtype
                or len(mask) != len(ids)
                or not _CARRIED_BESIDE_MASK.isdisjoint(payload)
            ):
                return None
        begin, end = end, end + n
        input_ids[begin:end] = ids[start : start + n]
        if loss_mask is not None:
            loss_mask[begin:end] = mask[start : start + n]
        first = start if continue_positions else 0
        if first + n <= len(_RAMP):
            positions[begin:end] = _RAMP[first : first + n]
        else:
            positions[begin:end] = np.arange(first, first + n)
        segment_ids[begin:end] = segment
    padding_mask = np.zeros(pad_to, dtype=np.bool_)
    padding_mask[:end] = True
    row: dict[str, np.ndarray] = {
        "input_ids": input_ids,
        "positions": positions,
        "segment_ids": segment_ids,
    }
    if loss_mask is not None:
        row["loss_mask"] = loss_mask
    row["padding_mask"] = padding_mask
    return row


class _PackBase(Operator):
    """Shared constructor, accumulator and assembly of the two packing operators."""

    default_parallelism = 0  # row assembly is vectorised: runs in its driver thread

    #: Whether rows are padded to ``max_length`` (``pack_flat``).
    padded: ClassVar[bool] = False

    def __init__(
        self,
        *,
        max_length: int,
        algorithm: str = "first_fit",
        max_open_bins: int = 8,
        min_useful_length: int | None = None,
        oversized: str = "split",
        emit_labels: bool = False,
        ignore_index: int = DEFAULT_IGNORE_INDEX,
        emit_cu_seqlens: bool = False,
        max_docs_per_row: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.policy = PackPolicy(
            max_length=max_length,
            algorithm=algorithm,
            max_open_bins=max_open_bins,
            min_useful_length=min_useful_length,
            oversized=oversized,
            op_name=self.op_name,
            max_docs_per_row=max_docs_per_row,
        )
        self.tensors = TrainerTensorOptions(
            emit_labels=emit_labels,
            ignore_index=ignore_index,
            emit_cu_seqlens=emit_cu_seqlens,
            max_docs_per_row=max_docs_per_row,
            op_name=self.op_name,
        )
        self._pad = 0

    @property
    def max_length(self) -> int:
        return self.policy.max_length

    @property
    def algorithm(self) -> str:
        return self.policy.algorithm

    def params(self) -> dict[str, Any]:
        policy = self.policy
        return {
            "max_length": policy.max_length,
            "algorithm": policy.algorithm,
            "max_open_bins": policy.max_open_bins,
            "min_useful_length": policy.threshold,
            "oversized": policy.oversized,
            **self.tensors.params(),
        }

    def output_tensors(self) -> tuple[str, ...]:
        names = ("input_ids", "positions", "segment_ids", *self.tensors.tensor_names())
        return (*names, "padding_mask") if self.padded else names

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, fusable=False)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        # Packing has no latency bound in either mode: bins close on content only.
        return PackAccumulator(self.policy, max_batch=self.microbatch_size)

    def process_many(self, elems: list[Any]) -> list[Any]:
        continue_positions = self.policy.algorithm == "wrap"
        pad_to = self.policy.max_length if self.padded else None
        options = self.tensors
        out = []
        for rec in elems:
            pieces = rec.payload["pieces"]
            row = assemble_row(
                pieces,
                continue_positions=continue_positions,
                pad_to=pad_to,
                pad_id=self._pad,
                op_name=self.op_name,
            )
            if options.any:
                if options.emit_labels and "labels" in row:
                    raise ContractError(
                        f"operator {self.op_name!r}: emit_labels is on but the packed records "
                        "already carry 'labels' (row of record "
                        f"{rec.meta.cursor} in lane {rec.meta.lane_id}); drop 'labels' from "
                        "the records or set emit_labels: false"
                    )
                row = add_trainer_tensors(row, [n for _, _, n in pieces], options)
            out.append(SampleRecord(row, rec.meta))
        return out


class PackSequences(_PackBase):
    """Packs a lane's tokenized records into unpadded rows of at most ``max_length`` tokens."""

    op_name = "pack_sequences"

    def __init__(self, *, max_length: int, **kwargs: Any) -> None:
        super().__init__(max_length=max_length, **kwargs)
        tensors = self.tensors
        if tensors.emit_labels and tensors.ignore_index != DEFAULT_IGNORE_INDEX:
            raise ConfigError(
                f"pack_sequences: ignore_index {tensors.ignore_index} needs pack_flat: batch pads "
                f"the labels of unequal rows with {DEFAULT_IGNORE_INDEX}; use ignore_index: "
                f"{DEFAULT_IGNORE_INDEX} or pack_flat"
            )


class PackFlat(_PackBase):
    """Packs a lane's tokenized records into rows of exactly ``max_length`` tokens (padded)."""

    op_name = "pack_flat"
    padded = True

    def __init__(self, *, max_length: int, pad_id: int | None = None, **kwargs: Any) -> None:
        if pad_id is not None and (not isinstance(pad_id, int) or isinstance(pad_id, bool)):
            raise ConfigError(
                f"pack_flat: pad_id must be an integer token id, got {pad_id!r}; leave it unset "
                "to use the tokenizer's pad id"
            )
        super().__init__(max_length=max_length, **kwargs)
        self.pad_id = pad_id
        self._pad = 0 if pad_id is None else pad_id

    def params(self) -> dict[str, Any]:
        return {**super().params(), "pad_id": self.pad_id}

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._pad = self.pad_id if self.pad_id is not None else ctx.pad_id
