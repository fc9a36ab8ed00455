"""Execution settings never change the data: runners, workers and micro-batch sizes."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from tests.support.builders import assert_closed_exactly_once, make_pipeline
from zephon_server.engine.errors import WorkerError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.ops.base import Operator, OpTraits
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.records import LaneEnd


def lane_chains(pipe: Pipeline, execution: ExecutionConfig) -> dict[int, list[str]]:
    chains: dict[int, list[str]] = defaultdict(list)
    for batch in pipe.run(execution).batches():
        assert batch.seq == len(chains[batch.lane_id])
        chains[batch.lane_id].append(batch.chain_digest.hex())
    return dict(chains)


def batch_pipeline(specs, **kwargs) -> Pipeline:
    return make_pipeline(specs, **kwargs).batch(microbatch_size=4)


@pytest.fixture(scope="module")
def oracle(corpus_specs):
    return lane_chains(batch_pipeline(corpus_specs), ExecutionConfig(runner="inline"))


@pytest.mark.parametrize("workers", [1, 2, 4, 16])
@pytest.mark.parametrize("fuse", [True, False])
def test_threads_equal_inline(corpus_specs, oracle, workers, fuse):
    got = lane_chains(
        batch_pipeline(corpus_specs), ExecutionConfig(runner="threads", workers=workers, fuse=fuse)
    )
    assert got == oracle
    assert len(oracle) == 4 and all(len(v) > 5 for v in oracle.values())


@pytest.mark.parametrize("mbs", [1, 7, 300])
def test_microbatch_sizes_do_not_change_data(corpus_specs, oracle, mbs):
    pipe = Pipeline(corpus_specs, seed=1234, lanes=4, chunk_size=32, flush_every_k_chunks=2)
    pipe.decode_text(microbatch_size=mbs).tokenize(tokenizer="byte", microbatch_size=mbs + 2)
    pipe.batch(microbatch_size=4)
    for runner, workers in (("inline", 1), ("threads", 3)):
        got = lane_chains(pipe, ExecutionConfig(runner=runner, workers=workers, fuse=False))
        assert got == oracle


def test_seed_and_lanes_do_change_data(corpus_specs, oracle):
    other_seed = lane_chains(batch_pipeline(corpus_specs, seed=99), ExecutionConfig("inline"))
    assert other_seed != oracle


def test_one_pass_closes_every_document_once_and_matches_weights(corpus_specs):
    pipe = batch_pipeline(corpus_specs)
    run = pipe.run(ExecutionConfig(runner="threads", workers=2))
    assert_closed_exactly_once(run)
    # Shares over the first 300 samples of the work source (all datasets still active there).
    counts = Counter()
    for g in range(300 // 32):
        chunk = run.work_source.chunk(g)
        counts.update(chunk.docs[:, 0].tolist())
    n = sum(counts.values())
    weights = np.array([d.spec.weight for d in run.plan.datasets])
    shares = np.array([counts[i] / n for i in range(len(weights))])
    # Smooth weighted round-robin: the share error is at most one sample per dataset.
    assert np.abs(shares - weights / weights.sum()).max() <= 2 / n


def test_non_deterministic_mode_delivers_every_record_once(corpus_specs):
    pipe = batch_pipeline(corpus_specs)
    run = pipe.run(ExecutionConfig(runner="threads", workers=4, deterministic=False))
    assert_closed_exactly_once(run)


def test_lane_end_follows_each_lane(corpus_specs):
    items = list(batch_pipeline(corpus_specs).run(ExecutionConfig(runner="threads")))
    ends = [i.lane_id for i in items if isinstance(i, LaneEnd)]
    assert sorted(ends) == [0, 1, 2, 3]
    for lane in ends:
        last = max(
            i for i, x in enumerate(items) if isinstance(x, NumberedBatch) and x.lane_id == lane
        )
        assert (
            items.index(next(x for x in items if isinstance(x, LaneEnd) and x.lane_id == lane))
            > last
        )


class Exploding(Operator):
    op_name = "exploding"

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        if any(e.meta.cursor == (1, 3) for e in elems):
            raise RuntimeError("bad record here")
        return elems


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_worker_exception_names_the_operator(corpus_specs, runner):
    pipe = make_pipeline(corpus_specs).apply(Exploding()).batch(microbatch_size=4)
    with pytest.raises(WorkerError, match=r"exploding.*bad record here"):
        list(pipe.run(ExecutionConfig(runner=runner, workers=2)))


class ReturnsDict(Operator):
    op_name = "returns_dict"

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return [e.payload for e in elems]


def test_returning_a_bare_payload_is_a_type_error(corpus_specs):
    pipe = make_pipeline(corpus_specs).apply(ReturnsDict()).batch(microbatch_size=4)
    with pytest.raises(TypeError, match="Unsupported element type: dict from operator"):
        list(pipe.run(ExecutionConfig(runner="inline")))
