"""Process tuning (server/zephon_server/runtime/): the tests that need worker processes or Ray
(the runners hand their workers the tuning, which they apply without reading the environment;
importing Ray's runner opens sockets).

The hermetic tests of the same topic are in ``tests/unit/test_runtime.py``.
"""

from __future__ import annotations

import os
import pickle

import pytest

from tests.support.builders import make_pipeline
from tests.unit.test_runtime import chains, probed
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.runtime import RuntimeConfig, gc_policy


@pytest.mark.timeout(240)
def test_process_workers_apply_the_config_the_runner_hands_them(
    corpus_specs, tmp_path, monkeypatch
):
    # The environment says otherwise: workers must not read it.
    monkeypatch.setenv(gc_policy.ENV, "default")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    tuning = RuntimeConfig(gc="tuned", tokenizers_parallelism=True)
    execution = ExecutionConfig(runner="processes", workers=2, worker_tuning=tuning)
    digests, seen = probed(corpus_specs, tmp_path / "tuned", execution)
    assert seen and str(os.getpid()) not in seen  # ran in worker processes
    for worker in seen.values():
        assert tuple(worker["threshold"]) == gc_policy.THRESHOLD
        assert worker["tokenizers"] == "true"
    # Untuned workers (no config handed down) keep CPython's collector; same data.
    plain = ExecutionConfig(runner="processes", workers=2)
    plain_digests, plain_seen = probed(corpus_specs, tmp_path / "plain", plain)
    assert plain_seen and all(
        tuple(w["threshold"]) != gc_policy.THRESHOLD for w in plain_seen.values()
    )
    assert (
        digests
        == plain_digests
        == chains(
            make_pipeline(corpus_specs, lanes=2).batch(microbatch_size=4),
            ExecutionConfig(runner="inline"),
        )
    )


def test_the_ray_actor_applies_the_tuning_before_loading_its_operators(monkeypatch):
    # The actor class itself (no Ray needed to call it): the tuning comes first.
    from zephon_server.engine.runners.ray import StepWorker

    calls = []

    class Tuning:
        def apply_in_worker(self) -> None:
            calls.append("tuned")

    worker = StepWorker([], pickle.dumps("not a step"), [], Tuning())
    assert calls == ["tuned"]
    assert worker.error is not None  # the step itself could not load: reported, as before
