"""Stateful pipelines (mixture, packing, shuffling) are identical across runners and workers."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.support.builders import assert_closed_exactly_once, make_pipeline
from zephon_server.engine.execution import ExecutionConfig

SHUFFLES = ["streaming", "block", "block_warmup"]


def stateful(specs, algorithm, *, mbs=None, pack="pack_flat", k=2):
    extra = {} if mbs is None else {"microbatch_size": mbs}
    ops = [
        ("ensure_mixture", {"buffer_size": 32, **extra}),
        (pack, {"max_length": 128, "algorithm": "first_fit", **extra}),
        ("shuffle", {"buffer_size": 16, "algorithm": algorithm, "warmup_size": 4, "seed": 5}),
    ]
    pipe = make_pipeline(specs, ops=ops, k=k)
    return pipe.batch(microbatch_size=4)


def chains(pipe, execution):
    out = defaultdict(list)
    for b in pipe.run(execution).batches():
        out[b.lane_id].append(b.chain_digest.hex())
    return dict(out)


@pytest.fixture(scope="module")
def oracles(corpus_specs):
    return {
        a: chains(stateful(corpus_specs, a), ExecutionConfig(runner="inline")) for a in SHUFFLES
    }


@pytest.mark.parametrize("algorithm", SHUFFLES)
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_threads_equal_inline(corpus_specs, oracles, algorithm, workers):
    got = chains(
        stateful(corpus_specs, algorithm), ExecutionConfig(runner="threads", workers=workers)
    )
    assert got == oracles[algorithm]
    assert sum(len(v) for v in got.values()) > 20


@pytest.mark.parametrize("algorithm", SHUFFLES)
def test_microbatch_sizes_and_fusion_do_not_change_data(corpus_specs, oracles, algorithm):
    for mbs in (1, 5):
        got = chains(
            stateful(corpus_specs, algorithm, mbs=mbs),
            ExecutionConfig(runner="threads", workers=3, fuse=False),
        )
        assert got == oracles[algorithm]


@pytest.mark.parametrize("pack", ["pack_flat", "pack_sequences"])
@pytest.mark.parametrize("algorithm", SHUFFLES)
def test_every_document_closed_exactly_once(corpus_specs, algorithm, pack):
    run = stateful(corpus_specs, algorithm, pack=pack).run(ExecutionConfig(runner="threads"))
    assert_closed_exactly_once(run)


def test_pack_flat_rows_are_fixed_length_with_positions(corpus_specs):
    batch = next(stateful(corpus_specs, "block").run(ExecutionConfig(runner="inline")).batches())
    assert batch.tensors["input_ids"].shape == (4, 128)
    assert set(batch.tensors) >= {"input_ids", "positions", "segment_ids", "padding_mask"}
    assert (batch.tensors["positions"][:, 0] == 0).all()


def test_non_deterministic_mode_still_delivers_everything_once(corpus_specs):
    run = stateful(corpus_specs, "streaming").run(
        ExecutionConfig(runner="threads", workers=3, deterministic=False)
    )
    assert_closed_exactly_once(run)


def test_a_run_of_a_lane_that_does_not_exist_names_the_lanes_there_are(corpus_specs):
    from zephon_server.engine.errors import ConfigError

    pipe = make_pipeline(corpus_specs, ops=[], k=2).batch(microbatch_size=4)
    n = pipe.lanes
    with pytest.raises(ConfigError, match=rf"lane {n} does not exist; lanes are 0\.\.{n - 1}"):
        pipe.run(ExecutionConfig(runner="inline"), lanes=[0, n])
    run = pipe.run(ExecutionConfig(runner="inline"), lanes=[1, 0, 1])
    try:
        assert run.lanes == [0, 1]
    finally:
        run.close()
