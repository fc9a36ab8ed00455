"""Tokenizers: a BPE tokenizer trained on the spot and the byte tokenizer, BOS/EOS placement, and a
BPE pipeline giving the same stream on every runner: the tests that need a subprocess, worker
processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_tokenizer.py``.
"""

from __future__ import annotations

import pytest

from tests.unit.test_tokenizer import (
    bpe_pipeline,
)
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch


def chains(run):
    out: dict[int, list[str]] = {}
    for item in run:
        if isinstance(item, NumberedBatch):
            out.setdefault(item.lane_id, []).append(item.chain_digest.hex())
    return out


@pytest.mark.processes
def test_bpe_pipeline_is_identical_on_every_runner(corpus_specs, bpe_path):
    pipe = bpe_pipeline(corpus_specs, bpe_path)
    reference = chains(pipe.run(ExecutionConfig(runner="inline")))
    assert sum(len(v) for v in reference.values()) >= 20
    for runner, workers in [("threads", 1), ("threads", 2), ("processes", 2)]:
        got = chains(pipe.run(ExecutionConfig(runner=runner, workers=workers)))
        assert got == reference, (runner, workers)
