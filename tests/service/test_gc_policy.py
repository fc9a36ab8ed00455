"""The garbage-collector policy of Zephon's own processes (server/zephon_server/runtime/).

``tuned`` (the default) freezes start-up objects and raises the first collection threshold in
``zephon serve`` and in ``--runner processes`` workers, which get it from the runner (the
``RuntimeConfig``), never from the environment; ``default`` keeps CPython's settings;
an unknown value fails at start-up naming the choices. The batches are bit-identical either
way (real servers, digests compared).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from zephon_server.engine.runners import processes
from zephon_server.runtime import RuntimeConfig, gc_policy
from zephon_testing.servers import dump_digests, lane_digests, serve_once, server, write_config

PROBE = """
import gc, json
from zephon_server.runtime import gc_policy
before = gc.get_threshold()
gc_policy.apply({mode!r})
print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))
"""


def probe(mode: str) -> tuple[list[int], list[int], int]:
    """(thresholds before, after, frozen objects) of a fresh interpreter applying ``mode``."""
    import json

    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(mode=mode)], capture_output=True, text=True, check=True
    ).stdout
    before, after, frozen = json.loads(out)
    return before, after, frozen


def test_tuned_freezes_start_up_objects_and_raises_the_threshold():
    before, after, frozen = probe("tuned")
    assert tuple(after) == gc_policy.THRESHOLD != tuple(before)
    assert frozen > 1000  # the interpreter's and Zephon's modules
    before, after, frozen = probe("default")
    assert after == before and frozen == 0


def worker_threshold(env_value: str | None, tuning: RuntimeConfig | None = None) -> tuple[int, ...]:
    """The thresholds a processes-runner worker runs with, handed ``tuning`` and started
    under ``ZEPHON_GC`` = ``env_value``."""
    saved = os.environ.get(gc_policy.ENV)
    try:
        if env_value is None:
            os.environ.pop(gc_policy.ENV, None)
        else:
            os.environ[gc_policy.ENV] = env_value
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            1,
            mp_context=ctx,
            initializer=processes._init_worker,
            initargs=processes._initargs([], [], None, tuning),
        ) as pool:
            return tuple(pool.submit(gc.get_threshold).result(timeout=60))
    finally:
        if saved is None:
            os.environ.pop(gc_policy.ENV, None)
        else:
            os.environ[gc_policy.ENV] = saved


@pytest.mark.timeout(120)
def test_processes_workers_apply_the_policy_the_runner_hands_them():
    tuned, plain = RuntimeConfig(gc="tuned"), RuntimeConfig(gc="default")
    assert worker_threshold(None, tuned) == gc_policy.THRESHOLD
    assert worker_threshold(None, plain) != gc_policy.THRESHOLD
    # the environment is not read in the worker: the config decides
    assert worker_threshold("default", tuned) == gc_policy.THRESHOLD
    assert worker_threshold("tuned", plain) != gc_policy.THRESHOLD
    # no tuning handed down (an embedding program's plain ExecutionConfig): CPython's own
    assert worker_threshold("tuned", None) != gc_policy.THRESHOLD


@pytest.mark.service
@pytest.mark.timeout(240)
def test_serve_applies_the_policy_and_the_data_do_not_change(tmp_path, corpus_dir):
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=2)
    args = ["--config", str(cfg), "--runner", "processes", "--workers", "2"]
    with server(args, tmp_path) as tuned:
        assert "garbage collector: tuned" in tuned.output()
        digests = lane_digests(tuned, 2)
    with server([*args, "--gc", "default"], tmp_path) as plain:
        assert "garbage collector: default" in plain.output()
        assert lane_digests(plain, 2) == digests
    # Both equal the inline runner's stream (`zephon dump`), the oracle.
    oracle = dump_digests(cfg, 1000)
    assert {lane: [d.hex() for d in chain] for lane, chain in digests.items()} == {
        lane: oracle[lane] for lane in range(2)
    }
    with server(args, tmp_path, env={gc_policy.ENV: "default"}) as by_env:
        assert "garbage collector: default" in by_env.output()


@pytest.mark.service
@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_unknown_policy_fails_at_start_up(tmp_path, corpus_dir, how):
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=2)
    args = ["--config", str(cfg)]
    if how == "flag":
        done = serve_once([*args, "--gc", "aggressive"], tmp_path)
    else:
        done = serve_once(args, tmp_path, env={gc_policy.ENV: "aggressive"})
    assert done.returncode == 2, done.stderr
    assert "unknown garbage-collector policy 'aggressive'" in done.stderr
    assert "choose one of: tuned, default" in done.stderr
