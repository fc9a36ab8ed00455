"""Process tuning (server/zephon_server/runtime/): one frozen config, built by the command line,
applied explicitly, and handed by the runners to their worker processes, which apply it
without reading the environment. The data never change.

The tests of the same topic that need a subprocess, worker processes, a socket or a real
file system limit are in ``tests/service/test_runtime.py``.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
from pathlib import Path

import pytest

from tests.support.builders import make_pipeline
from zephon_server.engine.errors import ConfigError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.ops.base import Operator, OpTraits
from zephon_server.runtime import ARENA_MAX, RuntimeConfig, from_environ


class Probe(Operator):
    """Passes records through; records, per worker process, what tuning it runs with."""

    op_name = "probe"

    def __init__(self, where: str, **kwargs):
        super().__init__(**kwargs)
        self.where = where

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        seen = {
            "threshold": list(gc.get_threshold()),
            "tokenizers": os.environ.get("TOKENIZERS_PARALLELISM"),
        }
        Path(self.where, str(os.getpid())).write_text(json.dumps(seen))
        return elems


def chains(pipe, execution: ExecutionConfig) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for item in pipe.run(execution):
        if isinstance(item, NumberedBatch):
            out.setdefault(item.lane_id, []).append(item.chain_digest.hex())
    return out


def probed(corpus_specs, where: Path, execution: ExecutionConfig):
    where.mkdir()
    pipe = make_pipeline(corpus_specs, lanes=2).apply(Probe(str(where))).batch(microbatch_size=4)
    digests = chains(pipe, execution)
    return digests, {p.name: json.loads(p.read_text()) for p in where.iterdir()}


def test_the_command_line_builds_the_config_from_flags_then_environment():
    assert from_environ({}) == RuntimeConfig()
    assert RuntimeConfig().malloc_arenas == ARENA_MAX and not RuntimeConfig().tokenizers_parallelism
    env = {"ZEPHON_GC": "default", "ZEPHON_ALLOCATOR": "system"}
    assert from_environ(env) == RuntimeConfig(allocator="system", gc="default")
    assert from_environ(env, allocator="auto", gc="tuned") == RuntimeConfig()
    # a limit the user set for glibc wins: the runtime then sets none
    assert from_environ({"MALLOC_ARENA_MAX": "2"}).malloc_arenas is None
    assert from_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=3"}).malloc_arenas is None
    for value, parallel in (("true", True), ("1", True), ("false", False), ("0", False)):
        config = from_environ({"TOKENIZERS_PARALLELISM": value})
        assert config.tokenizers_parallelism is parallel, value


def test_bad_values_are_refused_naming_the_setting():
    with pytest.raises(ConfigError, match="unknown garbage-collector policy 'x'"):
        RuntimeConfig(gc="x")
    with pytest.raises(ConfigError, match="malloc_arenas: must be a whole number"):
        RuntimeConfig(malloc_arenas=0)
    with pytest.raises(ConfigError, match="--allocator: expected one of"):
        RuntimeConfig(allocator="")
    with pytest.raises(ConfigError, match="worker_tuning: must have an apply_in_worker"):
        ExecutionConfig(worker_tuning="tuned")  # type: ignore[arg-type]
    # the tuning is the program's to give, never a YAML key
    with pytest.raises(ConfigError, match="unknown key 'worker_tuning'"):
        ExecutionConfig.from_mapping({"worker_tuning": None})


def test_the_config_travels_to_workers_as_it_is():
    config = RuntimeConfig(allocator="system", gc="default", malloc_arenas=None)
    assert pickle.loads(pickle.dumps(config)) == config
    execution = ExecutionConfig(worker_tuning=config)
    assert execution.with_overrides(workers=3).worker_tuning is config
    assert "worker_tuning" not in repr(execution)
