"""A custom operator with its own accumulator, as described in docs/custom-operators.md.

``DedupeWithinEpoch`` drops a document when the same text was already seen in the same lane
during the current epoch. The "seen" set is cross-call state, so it lives in the accumulator
(serial, in stream order, per lane); ``process_many`` stays stateless.
"""

from __future__ import annotations

import hashlib
from typing import Any

from zephon_server.api import (
    CountingAccumulator,
    Operator,
    OpTraits,
    Pipeline,
    default_pipeline_specs,
)


class DedupeAccumulator(CountingAccumulator):
    """Counting accumulator that turns repeats within a lane's epoch into tombstones."""

    reads_payload = True  # push_many looks at the text

    def __init__(self, max_batch: int, max_latency_ms: float | None) -> None:
        super().__init__(max_batch, max_latency_ms)
        self._seen: dict[int, set[str]] = {}

    def push_many(self, elems: Any) -> list[list[Any]]:
        kept = []
        for elem in elems:
            if not elem.meta.tombstone:
                key = hashlib.sha1(elem.payload["text"].encode()).hexdigest()
                seen = self._seen.setdefault(elem.meta.lane_id, set())
                if key in seen:
                    elem = elem.tombstone("duplicate")
                seen.add(key)
            kept.append(elem)
        return super().push_many(kept)

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[list[Any]]:
        if reset and lane_id is not None:
            self._seen.pop(lane_id, None)  # a reset lane must equal a fresh accumulator
        elif lane_id is None:
            self._seen.clear()
        return super().flush(reset=reset, lane_id=lane_id)

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        return super().has_pending_data(lane_id)


class DedupeWithinEpoch(Operator):
    """Drops repeated texts within a lane's epoch (tombstone reason ``duplicate``)."""

    op_name = "dedupe_within_epoch"
    default_microbatch_size = 64

    def traits(self) -> OpTraits:
        # Order is kept, but the accumulator holds cross-call state: not fusable.
        return OpTraits(preserves_cursor_order=True, fusable=False)

    def accumulator(self, *, deterministic: bool, ctx: Any) -> DedupeAccumulator:
        # Drop the latency bound in deterministic mode: boundaries must depend on counts only.
        latency = None if deterministic else self.max_latency_ms
        return DedupeAccumulator(self.microbatch_size, latency)

    def process_many(self, elems: list[Any]) -> list[Any]:
        return [e.with_payload({"text": e.payload["text"].strip()}) for e in elems]


def build():
    """The pipeline for ``zephon dump --pipeline examples/custom_operator.py:build``."""
    pipe = Pipeline(default_pipeline_specs(), seed=7, lanes=4, chunk_size=64)
    return (
        pipe.decode_text()
        .apply(DedupeWithinEpoch())
        .tokenize(tokenizer="byte")
        .batch(microbatch_size=8)
    )
