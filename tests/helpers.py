"""Small builders shared by the unit tests."""

from __future__ import annotations

import numpy as np

from zephon_server.engine.records import DocRef, SampleMeta, SampleRecord


def rec(lane: int, chunk: int, offset: int, tokens: int = 3, tombstone: str = "") -> SampleRecord:
    """A tokenized record with ``tokens`` ids, identity (lane, chunk, offset)."""
    doc = DocRef(0, 0, chunk * 1000 + offset, 0)
    meta = SampleMeta(lane, (chunk, offset), 0, doc, (doc,), tombstone=tombstone)
    if tombstone:
        return SampleRecord(None, meta)
    ids = np.arange(tokens, dtype=np.int32) + offset
    return SampleRecord({"input_ids": ids}, meta)


def cursors(groups):
    """Cursors of every element of a list of micro-batches."""
    return [[e.meta.cursor for e in g] for g in groups]
