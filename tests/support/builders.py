"""Small builders shared by the tests: records, streams, one-operator runs, pipelines."""

from __future__ import annotations

import numpy as np

from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline
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


def run_op(op, items, *, lanes: int = 4, seed: int = 0):
    """Run one operator inline over ``items`` (records and controls) and finish the stream.

    Returns the output items (records/batches and forwarded controls) in order.
    """
    from zephon_server.engine.ops.base import OpContext
    from zephon_server.engine.runners.base import execute_inline
    from zephon_server.engine.runners.steps import Step, StepDriver

    ctx = OpContext(op_name=op.op_name, op_index=0, lanes=lanes, seed=seed, pad_id=0)
    op.setup(ctx)
    driver = StepDriver(Step([op], 0), op.accumulator(deterministic=True, ctx=ctx))
    out = execute_inline(driver.feed(list(items)))
    out.extend(execute_inline(driver.finish()))
    return out


def tokenized_stream(
    lane: int, n: int, *, chunk_size: int = 8, seed: int = 0, max_tokens=40, datasets: int = 1
):
    """``n`` tokenized records of one lane with varied lengths, chunked like the source does."""
    rng = np.random.default_rng([seed, lane])
    out = []
    for i in range(n):
        chunk, offset = divmod(i, chunk_size)
        ds = int(rng.integers(0, datasets))
        doc = DocRef(ds, 0, i, 0)
        length = int(rng.integers(1, max_tokens + 1))
        ids = rng.integers(0, 250, size=length).astype(np.int32)
        from zephon_server.engine.records import Span

        meta = SampleMeta(lane, (chunk, offset), ds, doc, (doc,), spans=(Span(doc, 0, length),))
        out.append(SampleRecord({"input_ids": ids}, meta))
    return out


def assert_closed_exactly_once(run) -> None:
    """Consume ``run``; every source document must be closed exactly once (rows + tombstones)."""
    from collections import Counter

    closed: Counter = Counter()
    for item in run:
        if isinstance(item, NumberedBatch):
            closed.update(item.closes())
    for log in run.logs.values():
        for meta in log.tail_tombstones:
            closed.update(meta.closes)
    assert set(closed.values()) == {1}, [d for d, n in closed.items() if n != 1][:5]
    assert len(closed) == sum(d.num_rows for d in run.plan.datasets)


def lane_chains(run, limit=None):
    """Consume ``run``; {lane: [(seq, chain_hex)]} (stop once every lane has ``limit``)."""
    out: dict[int, list] = {lane: [] for lane in run.lanes}
    for item in run:
        if isinstance(item, NumberedBatch):
            out[item.lane_id].append((item.seq, item.chain_digest.hex()))
            if limit is not None and all(len(v) >= limit for v in out.values()):
                break
    run.close()
    return out


def make_pipeline(specs, *, lanes=4, chunk_size=32, k=2, seed=1234, ops=None) -> Pipeline:
    """A pipeline over the corpus; ``ops`` is a list of (name, params) appended before batch."""
    pipe = Pipeline(specs, seed=seed, lanes=lanes, chunk_size=chunk_size, flush_every_k_chunks=k)
    pipe.decode_text().tokenize(tokenizer="byte")
    for name, params in ops or []:
        pipe.add(name, **params)
    return pipe


def slow_first_batch_pipeline(specs) -> Pipeline:
    """Four lanes whose first batch waits for about three chunks (a 512-row shuffle over
    ~200 packed rows a chunk) while one chunk promises it one: ``end_of_data: shortest``."""
    pipe = Pipeline(specs, seed=5, lanes=4, chunk_size=256, end_of_data="shortest")
    pipe.decode_text().tokenize(tokenizer="byte").pack_flat(max_length=512)
    return pipe.shuffle(buffer_size=512).batch(microbatch_size=3)
