"""Packing's trainer tensors: the tests that need worker processes or a server (the YAML
pipeline on the processes runner; a real server streaming the tensors to the client).

The hermetic tests of the same topic are in ``tests/unit/test_trainer_tensors.py``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.unit.test_trainer_tensors import (
    IGNORE,
    run_chains,
    write_pipeline,
)
from zephon_server.engine.config import load_config
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.trainer_tensors import next_token_labels

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.processes
def test_yaml_pipeline_processes_equal_inline(yaml_oracle):
    from zephon_server.engine import shm

    path, (chains, _) = yaml_oracle
    got, _ = run_chains(path, ExecutionConfig(runner="processes", workers=2))
    assert got == chains
    assert shm.live_blocks() == 0


@pytest.mark.service
def test_server_streams_the_trainer_tensors_to_the_client(tmp_path, corpus_dir):
    from zephon_client import DataClient
    from zephon_proto.v1 import data_service_pb2 as pb
    from zephon_testing.servers import server

    # the server imports the pipeline's mask function as this process does: from the repository
    pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    cfg = write_pipeline(tmp_path / "pipeline.yaml", corpus_dir)
    pipe, _ = load_config(cfg)
    want: dict[int, list[str]] = defaultdict(list)
    for batch in pipe.run(ExecutionConfig(runner="inline")).batches():
        if len(want[batch.lane_id]) < 3:
            want[batch.lane_id].append(batch.chain_digest.hex())
    with server(["--config", str(cfg)], tmp_path, env={"PYTHONPATH": pythonpath}) as srv:
        info = srv.stub().GetInfo(pb.GetInfoRequest(), timeout=10)
        assert {"labels", "cu_seqlens", "num_docs", "max_seqlen"} <= set(info.tensor_names)
        got: dict[int, list[str]] = defaultdict(list)
        with DataClient(srv.address, rank=0, world_size=1) as client:
            for batch in client:
                t = batch.tensors
                assert t["cu_seqlens"].shape == (4, 5) and t["cu_seqlens"].dtype == np.int32
                assert t["num_docs"].shape == t["max_seqlen"].shape == (4,)
                assert t["labels"].shape == t["input_ids"].shape and t["labels"].dtype == np.int32
                for i in range(4):
                    want_labels = next_token_labels(
                        t["input_ids"][i], t["segment_ids"][i], t["loss_mask"][i], IGNORE
                    )
                    np.testing.assert_array_equal(t["labels"][i], want_labels)
                got[batch.lane].append(batch.chain_digest.hex())
                if all(len(got[lane]) >= 3 for lane in (0, 1)):
                    client.mark_consumed()
                    break
    assert {lane: v[:3] for lane, v in got.items()} == dict(want)


def test_restore_at_every_step_equals_uninterrupted(yaml_oracle):
    from tests.support.builders import lane_chains
    from zephon_server.engine.checkpoint import ResumeState
    from zephon_server.engine.run import PipelineRun

    path, _ = yaml_oracle
    pipe, _ = load_config(path)
    full_run = PipelineRun(pipe.plan(ExecutionConfig(runner="inline")))
    full = lane_chains(full_run)
    longest = max(len(v) for v in full.values())
    for cut in range(0, longest + 1, 3):
        positions = {lane: min(cut, len(v)) for lane, v in full.items()}
        state = ResumeState.decode(full_run.checkpoint(positions).encode())
        resumed = lane_chains(
            PipelineRun(pipe.plan(ExecutionConfig(runner="threads", workers=2)), resume=state)
        )
        for lane, seqs in full.items():
            assert resumed[lane] == seqs[positions[lane] :], (cut, lane)
