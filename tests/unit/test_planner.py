"""Planner decisions that only steer execution: fusion, and which steps run in their driver."""

from __future__ import annotations

import pytest

from tests.support.builders import make_pipeline
from zephon_server.cli import build_parser
from zephon_server.engine.errors import ZephonError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.serve_flags import state_config
from zephon_server.service.server import replay_cache_of


def step_workers(plan):
    return {
        op.op_name: step.workers for stage in plan.stages for step in stage.steps for op in step.ops
    }


def stateful(specs, **shuffle):
    pipe = make_pipeline(specs)
    pipe.ensure_mixture().pack_flat(max_length=128).shuffle(buffer_size=8, **shuffle)
    return pipe.batch(microbatch_size=4)


def test_cheap_stateful_steps_run_in_their_driver_thread(corpus_specs):
    workers = step_workers(
        stateful(corpus_specs).plan(ExecutionConfig(runner="threads", workers=2))
    )
    assert workers["tokenize"] == 2  # the fused fetch → decode → tokenize step keeps its pool
    for name in ("ensure_mixture", "pack_flat", "shuffle", "replay_filter", "batch"):
        assert workers[name] == 0, name
    # the fused step is headed by fetch, whose call size is 256 documents
    head = stateful(corpus_specs).plan(ExecutionConfig()).stages[0].steps[0]
    assert head.ops[0].op_name == "fetch" and head.ops[0].microbatch_size == 256


def test_explicit_parallelism_still_gives_a_step_a_pool(corpus_specs):
    plan = stateful(corpus_specs, parallelism=3).plan(ExecutionConfig(runner="threads"))
    workers = step_workers(plan)
    assert workers["shuffle"] == 3 and workers["pack_flat"] == 0
    assert "parallelism=3" in plan.explain() and "in-driver" in plan.explain()


def replay_cache_from_flags(*flags: str):
    """The replay cache a ``zephon serve`` command line with ``flags`` builds."""
    args = build_parser().parse_args(["serve", *flags])
    return replay_cache_of(state_config(args, {}))


def test_replay_cache_flags(tmp_path):
    assert replay_cache_from_flags() is None  # no state dir, no cache
    cache = replay_cache_from_flags("--state-dir", str(tmp_path))
    assert cache is not None and cache.root == tmp_path / "replay-cache" and cache.keep_epochs == 2
    assert replay_cache_from_flags("--state-dir", str(tmp_path), "--replay-cache", "off") is None
    elsewhere = replay_cache_from_flags(
        "--replay-cache", str(tmp_path / "rc"), "--replay-cache-epochs", "3"
    )
    assert (
        elsewhere is not None and elsewhere.root == tmp_path / "rc" and elsewhere.keep_epochs == 3
    )
    with pytest.raises(ZephonError, match="--replay-cache-epochs must be an integer >= 1"):
        replay_cache_from_flags("--state-dir", str(tmp_path), "--replay-cache-epochs", "0")
