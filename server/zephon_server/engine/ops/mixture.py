"""``ensure_mixture``: reorder each lane's records so the output tracks the target mixture.

The work source already assigns sample slots by weight, but after tokenization, splitting and
filtering the *token* shares drift, and datasets can arrive in long runs. This operator keeps,
per lane, one FIFO per dataset and the amount already emitted per dataset (tokens; trained
tokens with ``by="loss_tokens"``; or samples with ``by="samples"``), and emits by a
generalised smooth weighted round-robin:

**Rule.** Weights are made integers ``w_d = max(1, round(weight_d * 1_000_000))`` with sum
``W``. With ``e_d`` the amount of dataset ``d`` emitted by the lane and ``E = sum(e_d)``, the
*deficit* of ``d`` is ``D_d = w_d * (E + 1) - W * e_d`` (``W`` times how far ``d`` would lag
its share after one more unit). The *target* is the dataset with the largest deficit, ties
going to the smaller dataset id. Exact integer arithmetic, so the choice is the same on every
platform. With ``by="samples"`` and every FIFO non-empty this is exactly nginx's smooth
weighted round-robin (the rule the work source uses).

**Waiting and the documented drain.** After each arrival the lane emits while the target's FIFO
has a record. When it is empty the lane waits for the target, unless the lane buffers more
than ``buffer_size`` records: then it *drains* one record from the non-empty FIFO with the
largest deficit and looks again. So at most ``buffer_size`` records stay buffered per lane
between calls (``buffer_size + 1`` for an instant). A dataset that never shows up in a lane
(exhausted, or absent) keeps the lane in drain mode: shares among the others stay balanced,
and the buffer stays full until the next reset.

**Trained tokens.** ``by="loss_tokens"`` counts a record's trained tokens, the currency SFT
mixtures are specified in: the number of non-zero entries of its ``loss_mask``, or all its
tokens when it has none (pretraining text: every token is trained). A record with no trained
token counts 0, so it never moves the shares.

**Pass-through.** Tombstones, records of datasets with weight 0 or absent from ``weights``,
and records without a known dataset id leave immediately and are not counted.

**Flushes.** ``flush(reset=True, lane_id=l)`` emits every record buffered for the lane in
deficit order (the same rule restricted to non-empty FIFOs) and drops the lane's state, so its
deficits start from zero (a fresh lane). End of stream does the same for every lane.

``process_many`` is a passthrough: all the work is stream-order logic in the accumulator.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..records import SampleRecord
from .accumulators import Accumulator, MicroBatch
from .base import OpContext, Operator, OpTraits

#: Weights become integers ``round(weight * WEIGHT_SCALE)`` for exact deficit arithmetic.
WEIGHT_SCALE = 1_000_000
log = logging.getLogger(__name__)
MIXTURE_UNITS: tuple[str, ...] = ("tokens", "samples", "loss_tokens")
#: A dataset under half its share is reported once the lane emitted this many buffers' worth.
STARVED_AFTER_BUFFERS = 4


class _MixtureLane:
    """Per-lane state: one FIFO and the emitted amount per managed dataset."""

    __slots__ = ("arrived", "buffered", "emitted", "fifos", "records", "total")

    def __init__(self, datasets: Sequence[int]) -> None:
        # Per dataset: (size, record) in arrival order; size in tokens or samples.
        self.fifos: dict[int, deque[tuple[int, Any]]] = {d: deque() for d in datasets}
        self.emitted: dict[int, int] = dict.fromkeys(datasets, 0)
        self.arrived: dict[int, int] = dict.fromkeys(datasets, 0)  # records, for the warning
        self.total = 0  # sum of emitted
        self.buffered = 0  # records in all FIFOs
        self.records = 0  # records emitted


class MixtureAccumulator(Accumulator):
    """Per-lane, per-dataset FIFOs emitted by deficit (see the module docstring).

    ``weights`` maps dataset id to a positive integer weight; other datasets pass through.
    """

    def __init__(
        self,
        weights: dict[int, int],
        *,
        by: str = "tokens",
        buffer_size: int = 256,
        names: Sequence[str] = (),
    ):
        if by not in MIXTURE_UNITS:
            raise ValueError(f"by must be one of {list(MIXTURE_UNITS)}, got {by!r}")
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an integer >= 1, got {buffer_size!r}")
        if any(not isinstance(w, int) or w < 1 for w in weights.values()):
            raise ValueError(f"weights must be positive integers, got {weights!r}")
        self.weights = dict(sorted(weights.items()))
        self.total_weight = sum(self.weights.values())
        self.by = by
        self.buffer_size = buffer_size
        self.reads_payload = by != "samples"
        self._lanes: dict[int, _MixtureLane] = {}
        self._names = list(names)  # dataset names by id, for the warning
        self._warned = False

    # -- the rule ------------------------------------------------------------------------

    def _size(self, elem: Any) -> int:
        if self.by == "samples":
            return 1
        payload = elem.payload
        if not isinstance(payload, dict) or "input_ids" not in payload:
            raise ConfigError(
                f"ensure_mixture(by={self.by!r}) needs tokenized records (payload['input_ids']); "
                "place it after tokenize, or use by='samples'"
            )
        if self.by == "loss_tokens":
            mask = payload.get("loss_mask")
            if mask is not None:
                return int(np.count_nonzero(mask))
        return len(payload["input_ids"])

    def _best(self, lane: _MixtureLane, *, non_empty: bool) -> int | None:
        """The dataset with the largest deficit (ties: smaller id), or None."""
        best: int | None = None
        best_deficit = 0
        step = lane.total + 1
        big_w = self.total_weight
        for d, w in self.weights.items():
            if non_empty and not lane.fifos[d]:
                continue
            deficit = w * step - big_w * lane.emitted[d]
            if best is None or deficit > best_deficit:
                best, best_deficit = d, deficit
        return best

    def _emit(self, lane: _MixtureLane, d: int, out: list[Any]) -> None:
        size, elem = lane.fifos[d].popleft()
        lane.emitted[d] += size
        lane.total += size
        lane.records += 1
        lane.buffered -= 1
        out.append(elem)

    def _advance(self, lane: _MixtureLane, out: list[Any]) -> None:
        """Emit while the target has data, draining one at a time while over the bound."""
        while lane.buffered:
            target = self._best(lane, non_empty=False)
            assert target is not None
            if not lane.fifos[target]:
                if lane.buffered <= self.buffer_size:
                    return
                if not self._warned:
                    self._warn_starved(lane, target)
                target = self._best(lane, non_empty=True)
                assert target is not None
            self._emit(lane, target, out)

    def _warn_starved(self, lane: _MixtureLane, d: int) -> None:
        """Log once when a dataset the lane waits for holds under half its share after many
        buffers' worth of records: the supply, not the order, is what is short."""
        share = lane.emitted[d] / lane.total if lane.total else 1.0
        target = self.weights[d] / self.total_weight
        if share >= target / 2 or lane.records < STARVED_AFTER_BUFFERS * self.buffer_size:
            return
        self._warned = True
        name = self._names[d] if d < len(self._names) else f"#{d}"
        if not lane.arrived[d]:  # a finite dataset that ran out: expected, and nothing to fix
            log.info(
                "ensure_mixture: no record of dataset %r has reached this lane since its epoch "
                "began (a dataset with exhaustion: stop that ran out, or whose records all "
                "fail before this step): the lane goes on with the other datasets. Logged "
                "once per worker.",
                name,
            )
            return
        if not lane.emitted[d] and not lane.fifos[d]:  # records came, all of size 0
            log.warning(
                "ensure_mixture: dataset %r holds none of the %s emitted: its %d record(s) on "
                "this lane carry no %s (by: loss_tokens counts the trained tokens: are its "
                "loss masks all zero?), so no weight can give it a share. Check how its "
                "records are masked, or leave it out of weights. Logged once per worker.",
                name,
                self.by,
                lane.arrived[d],
                self.by,
            )
            return
        log.warning(
            "ensure_mixture: dataset %r holds %.1f%% of the %s emitted, against its weight's "
            "%.1f%%, and none of its records is waiting (expected if it ran out: a dataset "
            "with exhaustion: stop): this operator only reorders what the "
            "source hands out, and the source hands out records by count (datasets' weights). "
            "Raise %r's weight in the datasets %s. Logged once per worker.",
            name,
            100 * share,
            self.by,
            100 * target,
            name,
            "to at least its share here"
            if self.by == "samples"
            else f"in proportion to how few {self.by} its records carry",
        )

    def _drain(self, lane: _MixtureLane, out: list[Any]) -> None:
        while lane.buffered:
            target = self._best(lane, non_empty=True)
            assert target is not None
            self._emit(lane, target, out)

    # -- accumulator interface -----------------------------------------------------------

    def push_many(self, elems: Sequence[Any]) -> list[MicroBatch]:
        outs: dict[int, list[Any]] = {}
        lanes = self._lanes
        weights = self.weights
        for elem in elems:
            lane_id = elem.meta.lane_id
            out = outs.get(lane_id)
            if out is None:
                out = outs[lane_id] = []
            dataset = elem.meta.dataset_id
            if dataset not in weights or (type(elem) is SampleRecord and elem.meta.tombstone):
                out.append(elem)
                continue
            size = self._size(elem)
            lane = lanes.get(lane_id)
            if lane is None:
                lane = lanes[lane_id] = _MixtureLane(list(weights))
            lane.fifos[dataset].append((size, elem))
            lane.arrived[dataset] += 1
            lane.buffered += 1
            self._advance(lane, out)
        return [out for out in outs.values() if out]

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        if lane_id is None:
            groups = []
            for lid in sorted(self._lanes):
                out: list[Any] = []
                self._drain(self._lanes[lid], out)
                if out:
                    groups.append(out)
            self._lanes.clear()
            return groups
        lane = self._lanes.pop(lane_id, None) if reset else self._lanes.get(lane_id)
        if lane is None:
            return []
        out = []
        self._drain(lane, out)
        return [out] if out else []

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        if lane_id is not None:
            lane = self._lanes.get(lane_id)
            return bool(lane and lane.buffered)
        return any(lane.buffered for lane in self._lanes.values())

    def lanes_state(self) -> dict[int, int]:
        """Buffered record count per lane (for tests and metrics)."""
        return {lid: lane.buffered for lid, lane in self._lanes.items() if lane.buffered}

    def emitted(self, lane_id: int) -> dict[int, int]:
        """Amount emitted per dataset by a lane since its last reset (for tests and metrics)."""
        lane = self._lanes.get(lane_id)
        return dict(lane.emitted) if lane else dict.fromkeys(self.weights, 0)


class EnsureMixture(Operator):
    """Reorders each lane so its running token (or sample) shares track the target weights.

    ``weights`` maps dataset names to target weights (default: the datasets' configured
    weights); datasets with weight 0 or left out pass through unchanged. ``by`` is
    ``"tokens"`` (``len(payload["input_ids"])``), ``"loss_tokens"`` (trained tokens: the
    non-zero ``loss_mask`` entries, all tokens without one) or ``"samples"``. ``buffer_size``
    bounds the records buffered per lane (see the module docstring for the drain).
    """

    op_name = "ensure_mixture"
    default_parallelism = 0  # cheap next to tokenizing: runs in its driver thread

    def __init__(
        self,
        *,
        weights: dict[str, float] | None = None,
        by: str = "tokens",
        buffer_size: int = 256,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if weights is not None:
            if not isinstance(weights, dict) or not weights:
                raise ConfigError(
                    f"ensure_mixture: weights must be a non-empty mapping of dataset name to "
                    f"weight (or omitted for the configured weights), got {weights!r}"
                )
            for name, value in weights.items():
                if not isinstance(name, str):
                    raise ConfigError(
                        f"ensure_mixture: weights keys must be dataset names, got {name!r}"
                    )
                if (
                    isinstance(value, bool)
                    or not isinstance(value, numbers.Real)
                    or not math.isfinite(float(value))
                    or value < 0
                ):
                    raise ConfigError(
                        f"ensure_mixture: weights[{name!r}] must be a finite number >= 0, "
                        f"got {value!r}"
                    )
            if not any(float(v) > 0 for v in weights.values()):
                raise ConfigError(
                    f"ensure_mixture: weights needs at least one positive weight, got {weights!r}"
                )
        if by not in MIXTURE_UNITS:
            raise ConfigError(
                f"ensure_mixture: by must be one of {list(MIXTURE_UNITS)}, got {by!r}"
            )
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(
                f"ensure_mixture: buffer_size must be an integer >= 1, got {buffer_size!r}"
            )
        self.weights = dict(weights) if weights is not None else None
        self.by = by
        self.buffer_size = buffer_size

    def params(self) -> dict[str, Any]:
        return {"weights": self.weights, "by": self.by, "buffer_size": self.buffer_size}

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, fusable=False)

    def check_datasets(self, datasets: Sequence[Any]) -> None:
        """:class:`ConfigError` for a name of ``weights`` that is not one of the datasets'."""
        names = [spec.name for spec in datasets]
        unknown = [name for name in self.weights or () if name not in names]
        if unknown:
            raise ConfigError(
                f"ensure_mixture: weights names unknown dataset {unknown[0]!r}; "
                f"known datasets: {names}"
            )

    def resolve_weights(self, ctx: OpContext) -> dict[int, int]:
        """Integer weight per dataset id (position in ``ctx.datasets``); others pass through.

        Raises :class:`ConfigError` for a name that is not one of the pipeline's datasets.
        """
        names = [info.spec.name for info in ctx.datasets]
        if self.weights is None:
            chosen = {i: float(info.spec.weight) for i, info in enumerate(ctx.datasets)}
        else:
            self.check_datasets([info.spec for info in ctx.datasets])
            chosen = {names.index(name): float(w) for name, w in self.weights.items()}
        return {d: max(1, round(w * WEIGHT_SCALE)) for d, w in sorted(chosen.items()) if w > 0}

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.resolve_weights(ctx)  # fail fast on unknown names

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return MixtureAccumulator(
            self.resolve_weights(ctx),
            by=self.by,
            buffer_size=self.buffer_size,
            names=[info.spec.name for info in ctx.datasets],
        )

    def process_many(self, elems: list[Any]) -> list[Any]:
        return elems
