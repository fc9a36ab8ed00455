"""The Ray runner on a local Ray: remote stages equal inline, retries, clear failures.

One local Ray (2 CPUs) serves every test of the module; the runner uses it as it is (and
leaves it running). ``zephon dump --runner ray`` runs in a subprocess, where the runner
starts and stops a private local Ray of its own.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import yaml

from tests.support.builders import assert_closed_exactly_once
from zephon_server.engine.config import load_config
from zephon_server.engine.errors import ConfigError, WorkerError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.base import Operator, OpTraits
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.runners import ray as ray_runner
from zephon_server.engine.runners.ray import RayRunner
from zephon_server.runtime import RuntimeConfig, gc_policy
from zephon_testing.servers import dump_digests, write_config


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    started = time.monotonic()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        object_store_memory=128 << 20,
    )
    logging.getLogger(__name__).info("local Ray up in %.1f s", time.monotonic() - started)
    yield
    ray.shutdown()


STATEFUL = [
    ("pack_flat", {"max_length": 128}),
    ("shuffle", {"buffer_size": 8}),
    ("batch", {"microbatch_size": 4}),
]


def build(specs, placement: str, *extra: Operator, microbatch: int | None = None) -> Pipeline:
    """decode → tokenize(placement) → [extra] → pack → shuffle → batch over the corpus."""
    pipe = Pipeline(specs, seed=1234, lanes=4, chunk_size=16, flush_every_k_chunks=2)
    pipe.decode_text().tokenize(tokenizer="byte", placement=placement, microbatch_size=microbatch)
    for op in extra:
        pipe.apply(op)
    for name, params in STATEFUL:
        pipe.add(name, **params)
    return pipe


def chains(run) -> list[tuple[int, int, str]]:
    return [(b.lane_id, b.seq, b.chain_digest.hex()) for b in run.batches()]


def ray_runners(run) -> list[RayRunner]:
    return [r for r in run.runners if isinstance(r, RayRunner)]


@pytest.fixture(scope="module")
def inline_chains(corpus_specs):
    return chains(build(corpus_specs, "local").run(ExecutionConfig(runner="inline")))


# -- equality with inline -------------------------------------------------------------------


def test_remote_tokenize_stage_equals_inline(corpus_specs, inline_chains):
    pipe = build(corpus_specs, "remote")
    plan = pipe.plan(ExecutionConfig(runner="threads", workers=2))
    assert [s.runner for s in plan.stages] == ["threads", "ray", "threads"]
    assert plan.fingerprint == build(corpus_specs, "local").plan().fingerprint  # placement: no
    run = pipe.run(ExecutionConfig(runner="threads", workers=2))
    assert chains(run) == inline_chains
    assert ray.is_initialized()  # a Ray the application started is left running


def test_yaml_placement_remote_equals_inline(tmp_path, corpus_dir):
    ops = [
        {"tokenize": {"tokenizer": "byte", "placement": "remote", "parallelism": 2}},
        {"pack_flat": {"max_length": 256}},
        {"shuffle": {"buffer_size": 8}},
    ]
    cfg = write_config(tmp_path / "remote.yaml", corpus_dir, lanes=4, extra_ops=ops[1:])
    data = yaml.safe_load(cfg.read_text())
    data["pipeline"][1] = ops[0]
    cfg.write_text(yaml.safe_dump(data))
    pipeline, execution = load_config(cfg)
    plan = pipeline.plan(execution)
    assert [s.runner for s in plan.stages] == ["threads", "ray", "threads"]
    assert plan.stages[1].steps[0].workers == 2
    local, _ = load_config(cfg)
    for op in local.ops:
        op.placement = "local"
    assert local.plan().fingerprint == plan.fingerprint
    oracle = chains(local.run(ExecutionConfig(runner="inline")))
    assert chains(pipeline.run(execution)) == oracle


class ThresholdProbe(Operator):
    """Passes records through; writes its process's collector thresholds to ``where/<pid>``."""

    op_name = "threshold_probe"

    def __init__(self, where: str, **kwargs):
        super().__init__(**kwargs)
        self.where = where

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        (Path(self.where) / str(os.getpid())).write_text(json.dumps(gc.get_threshold()))
        return elems


def test_ray_actors_apply_the_worker_tuning_they_are_handed(corpus_specs, inline_chains, tmp_path):
    pipe = build(corpus_specs, "local", ThresholdProbe(str(tmp_path)))
    tuning = RuntimeConfig(gc="tuned")
    run = pipe.run(ExecutionConfig(runner="ray", workers=2, worker_tuning=tuning))
    assert chains(run) == inline_chains
    seen = {p.name: tuple(json.loads(p.read_text())) for p in tmp_path.iterdir()}
    assert seen and str(os.getpid()) not in seen  # ran on the actors
    assert set(seen.values()) == {gc_policy.THRESHOLD}


def test_runner_ray_puts_map_stages_on_ray_and_equals_inline(corpus_specs, inline_chains):
    pipe = build(corpus_specs, "local")
    plan = pipe.plan(ExecutionConfig(runner="ray"))
    assert [s.runner for s in plan.stages] == ["ray", "threads"]  # stateful stays on threads
    assert chains(pipe.run(ExecutionConfig(runner="ray", workers=2))) == inline_chains


def test_non_deterministic_mode_on_ray_closes_every_document_exactly_once(corpus_specs):
    pipe = build(corpus_specs, "remote")
    run = pipe.run(ExecutionConfig(runner="ray", workers=2, deterministic=False))
    assert_closed_exactly_once(run)


def test_dump_runner_ray_equals_inline(tmp_path, corpus_dir):
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=4)
    expected = dump_digests(cfg, 3)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ZEPHON_RAY_ADDRESS")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "zephon_server.cli",
            "dump",
            "--config",
            str(cfg),
            "--runner",
            "ray",
            "--format",
            "digest",
            "--batches",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got: dict[int, list[str]] = {}
    for line in res.stdout.splitlines():
        lane, _seq, digest = line.split()
        got.setdefault(int(lane), []).append(digest)
    assert got == expected
    assert "shutting down the local Ray" in res.stderr  # it started its own and stopped it


# -- failures -------------------------------------------------------------------------------


class DieOnce(Operator):
    """Kills its worker process the first time any worker runs it (a marker file decides)."""

    op_name = "die_once"
    default_microbatch_size = 8

    def __init__(self, marker: str, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return elems
        os.close(fd)
        os._exit(7)


def test_actor_dying_mid_run_is_retried_on_another_actor(tmp_path, corpus_specs, inline_chains):
    pipe = build(corpus_specs, "local", DieOnce(str(tmp_path / "died"), placement="remote"))
    run = pipe.run(ExecutionConfig(runner="threads", workers=2))
    assert chains(run) == inline_chains
    assert (tmp_path / "died").exists()
    (runner,) = ray_runners(run)
    assert runner.retries >= 1
    assert runner.actors_replaced >= 1


def test_killed_actor_is_replaced_and_output_unchanged(corpus_specs, inline_chains):
    pipe = build(corpus_specs, "remote", microbatch=4)
    run = pipe.run(ExecutionConfig(runner="threads", workers=2))
    got = []
    killed = None
    for batch in run.batches():
        got.append((batch.lane_id, batch.seq, batch.chain_digest.hex()))
        if killed is None:
            (runner,) = ray_runners(run)
            (pool,) = runner._pools.values()
            killed = pool.actors[0]
            ray.kill(killed, no_restart=True)
    assert got == inline_chains
    assert runner.retries >= 1 and runner.actors_replaced >= 1


class Boom(Operator):
    """Raises on one record: a deterministic operator failure."""

    op_name = "boom_op"

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        if any(e.meta.cursor[:2] == (1, 3) for e in elems):
            raise ValueError("boom at (1, 3)")
        return elems


def test_operator_exception_is_a_worker_error_naming_it_and_not_retried(corpus_specs):
    pipe = build(corpus_specs, "local", Boom(placement="remote"))
    run = pipe.run(ExecutionConfig(runner="threads", workers=2))
    with pytest.raises(WorkerError) as info:
        chains(run)
    assert info.value.op_name == "boom_op"
    assert "ValueError: boom at (1, 3)" in str(info.value)
    assert "boom_op" in str(info.value)
    (runner,) = ray_runners(run)
    assert runner.retries == 0


class BadSetup(Operator):
    op_name = "bad_setup"

    def setup(self, ctx):
        super().setup(ctx)
        if ctx.worker_id:  # only on workers: the driver sets up with worker_id 0
            raise RuntimeError("no GPU here")

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return elems


def test_setup_failure_on_a_worker_is_a_clear_error(corpus_specs):
    pipe = build(corpus_specs, "local", BadSetup(placement="remote"))
    with pytest.raises(WorkerError, match=r"bad_setup.*cannot set up on a Ray worker.*no GPU"):
        chains(pipe.run(ExecutionConfig(runner="threads", workers=2)))


class AlwaysDie(Operator):
    op_name = "always_die"

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        os._exit(9)


def test_repeated_actor_failure_ends_the_stream_with_a_clear_error(corpus_specs):
    pipe = build(corpus_specs, "local", AlwaysDie(placement="remote", parallelism=1))
    start = time.monotonic()
    run = pipe.run(ExecutionConfig(runner="threads", workers=2))
    with pytest.raises(WorkerError) as info:
        chains(run)
    assert time.monotonic() - start < 90
    message = str(info.value)
    assert "always_die" in message
    assert f"failed on {ray_runner.MAX_RETRIES + 1} Ray actors in a row" in message
    assert "ActorDiedError" in message


# -- configuration --------------------------------------------------------------------------


def test_ray_address_comes_from_the_config_and_the_command_line_reads_the_environment(
    monkeypatch, tmp_path, corpus_dir
):
    from zephon_server.cli import build_parser
    from zephon_server.pipeline_flags import load_pipeline

    # The engine reads no environment: only execution.ray_address counts there.
    monkeypatch.setenv("ZEPHON_RAY_ADDRESS", "auto")
    assert ray_runner.ray_address(None) is None
    assert ray_runner.ray_address("ray://head:10001") == "ray://head:10001"
    # The zephon command puts $ZEPHON_RAY_ADDRESS there, over the config's key.
    cfg = write_config(tmp_path / "p.yaml", corpus_dir)
    data = yaml.safe_load(cfg.read_text())
    data["execution"] = {**data.get("execution", {}), "ray_address": "ray://head:10001"}
    cfg.write_text(yaml.safe_dump(data))
    args = build_parser().parse_args(["explain", "--config", str(cfg)])
    assert load_pipeline(args)[1].ray_address == "auto"
    monkeypatch.delenv("ZEPHON_RAY_ADDRESS")
    assert load_pipeline(args)[1].ray_address == "ray://head:10001"


def test_ray_address_config_key(tmp_path, corpus_dir):
    cfg = write_config(tmp_path / "p.yaml", corpus_dir)
    data = yaml.safe_load(cfg.read_text())
    data["execution"]["ray_address"] = "ray://head:10001"
    cfg.write_text(yaml.safe_dump(data))
    _, execution = load_config(cfg)
    assert execution.ray_address == "ray://head:10001"
    with pytest.raises(ConfigError, match=r"execution\.ray_address"):
        ExecutionConfig(ray_address=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="placement"):
        Boom(placement="cluster")  # Operator is abstract: a concrete one validates


def test_a_ray_address_that_does_not_answer_fails_within_the_connect_timeout(tmp_path, corpus_dir):
    # Given host:port that nothing answers, ray.init waits without end: a dump hung for
    # minutes, a server said SERVING and made nothing.
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=4)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ZEPHON_RAY_ADDRESS")}
    env.update(ZEPHON_RAY_ADDRESS="127.0.0.1:1", ZEPHON_RAY_CONNECT_TIMEOUT="3")
    args = ["dump", "--config", str(cfg), "--runner", "ray", "--batches", "1"]
    res = subprocess.run(
        [sys.executable, "-m", "zephon_server.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert (
        "zephon: error: cannot start or connect to Ray at 127.0.0.1:1: no answer within 3 s"
        in res.stderr
    )


def test_the_connect_timeout_is_checked():
    from zephon_server.engine.runners.ray import DEFAULT_CONNECT_TIMEOUT_S, connect_timeout

    assert connect_timeout({}) == DEFAULT_CONNECT_TIMEOUT_S
    assert connect_timeout({"ZEPHON_RAY_CONNECT_TIMEOUT": "2.5"}) == 2.5
    with pytest.raises(ConfigError, match="ZEPHON_RAY_CONNECT_TIMEOUT must be a number"):
        connect_timeout({"ZEPHON_RAY_CONNECT_TIMEOUT": "soon"})


def test_every_ray_connection_is_made_on_one_daemon_thread():
    # a thread per connection piled up over a server's Resume calls; a joined one kept a
    # process whose connection hung from exiting
    import threading

    from zephon_server.engine.runners.ray import _CONNECTOR

    first = _CONNECTOR.submit(threading.current_thread).result(10)
    second = _CONNECTOR.submit(threading.current_thread).result(10)
    assert first is second and first.daemon and first.name == "zephon-ray-init"
    failed = _CONNECTOR.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(10)
    assert _CONNECTOR.submit(lambda: 7).result(10) == 7  # still serving after a failure
