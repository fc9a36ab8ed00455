"""The scenarios of ``tests/reliability/test_shard_identity_service.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import json
import queue
import subprocess
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.corpus import write_jsonl
from zephon_testing.scenarios.shard_identity import rewrite_same_size
from zephon_testing.servers import dump_digests, open_request, response_batches, serve_once, server


def write_setup(work: Path, docs: int = 240, shards: int = 4) -> Path:
    """A ``web`` corpus of ``shards`` JSONL files and a 2-lane pipeline config over it."""
    per = docs // shards
    for i in range(shards):
        rows = [
            json.dumps({"text": f"doc {k} alpha beta gamma " + "delta " * (k % 7)})
            for k in range(i * per, (i + 1) * per)
        ]
        write_jsonl(work / "web" / f"part-{i:05d}.jsonl", rows)
    cfg = {
        "seed": 5,
        "lanes": 2,
        "chunk_size": 8,
        "flush_every_k_chunks": 2,
        "datasets": [{"name": "web", "path": str(work / "web"), "weight": 1.0}],
        "pipeline": [{"tokenize": {"tokenizer": "byte"}}, {"batch": {"microbatch_size": 4}}],
        "execution": {"runner": "threads", "workers": 2},
    }
    path = work / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Changed:
    work: Path
    cfg: Path
    state_dir: Path
    state: bytes  # the checkpoint's bytes, taken before the rewrite
    shard: Path  # the shard rewritten in place after the checkpoint
    size: int


def make_changed(work: Path) -> Changed:
    """A checkpoint at seq 3 of both lanes by a server with a state directory, then a
    same-size in-place rewrite of one shard."""
    cfg = write_setup(work)
    state_dir = work / "state"
    with server(["--config", str(cfg), "--state-dir", str(state_dir)], work) as srv:
        stub = srv.stub()
        for lane in range(2):
            read(stub, lane, count=3)
        reply = stub.Checkpoint(
            pb.CheckpointRequest(positions=[pb.LanePosition(lane=n, next_seq=3) for n in (0, 1)]),
            timeout=30,
        )
    assert len(list((state_dir / "manifests").glob("*.json"))) == 1
    shard = work / "web" / "part-00001.jsonl"
    rewrite_same_size(shard)
    return Changed(work, cfg, state_dir, reply.state, shard, shard.stat().st_size)


def read(stub, lane: int, count: int | None = None) -> tuple[list, grpc.RpcError | None]:
    """Batches of ``lane`` from seq 0 (acknowledged as they come) until ``count``, the end,
    or an error (returned with the batches before it)."""
    requests: queue.Queue = queue.Queue()
    requests.put(open_request(lane, 0, "identity"))
    batches: list = []
    call = stub.StreamBatches(iter(requests.get, None), timeout=60)
    try:
        for resp in call:
            if resp.WhichOneof("kind") == "end":
                break
            got = response_batches(resp)
            batches.extend(got)
            requests.put(pb.StreamBatchesRequest(ack=pb.Ack(next_seq=got[-1].seq + 1)))
            if count is not None and len(batches) >= count:
                break
    except grpc.RpcError as err:
        return batches, err
    finally:
        requests.put(None)
        call.cancel()
    return batches, None


def run_resume_latest_onto_changed(changed: Changed) -> subprocess.CompletedProcess:
    """``zephon serve --resume latest`` onto the rewritten shard: checks it exits 2 naming the
    checkpoint, the shard and what changed; returns the run."""
    res = serve_once(
        ["--config", str(changed.cfg), "--state-dir", str(changed.state_dir), "--resume", "latest"],
        changed.work,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    # The start-up failure lists each refused checkpoint with its reason (startup slice).
    assert "zephon: error: --resume latest: no usable checkpoint" in res.stderr, res.stderr[-3000:]
    assert "ckpt-00000001: checkpoint does not match the data" in res.stderr, res.stderr[-3000:]
    assert f"shard {changed.shard} modified (modified time " in res.stderr, res.stderr[-3000:]
    assert f"size {changed.size} bytes unchanged" in res.stderr
    assert "Traceback" not in res.stderr
    return res


def run_resume_rpc_onto_changed(changed: Changed) -> dict[str, tuple[str, str]]:
    """The Resume RPC with the checkpoint's bytes onto the changed data, by a server with the
    state directory (its manifest names the shard) and one without. Checks both are
    FAILED_PRECONDITION naming the shard or the dataset and the fix; returns (code, details)."""
    request = pb.ResumeRequest(state=changed.state)
    out = {}
    # A server on the changed data with the state directory finds the shard manifest.
    args = ["--config", str(changed.cfg), "--state-dir", str(changed.state_dir)]
    with server(args, changed.work) as srv:
        with pytest.raises(grpc.RpcError) as info:
            srv.stub().Resume(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = info.value.details()
        out["with the state directory"] = (info.value.code().name, details)
        assert f"shard {changed.shard} modified (modified time " in details, details
        assert read(srv.stub(), 0, count=1)[1] is None  # refused: the server serves on
    # Without it (the bytes came from elsewhere) the message names the dataset and the fix.
    with server(["--config", str(changed.cfg)], changed.work) as srv:
        with pytest.raises(grpc.RpcError) as info:
            srv.stub().Resume(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = info.value.details()
        out["without it"] = (info.value.code().name, details)
        assert "dataset 'web': its shard list, or a shard's size, modification time or row" in (
            details
        )
        assert "cp -p" in details and "Traceback" not in details
    return out


def run_rewrite_while_serving(tmp_path: Path) -> dict[str, object]:
    """Every shard rewritten in place (same size) after lane 0's first 3 batches: checks the
    lane fails (INTERNAL naming the shard) and every batch served is the unchanged data's;
    returns the counts and the error."""
    cfg = write_setup(tmp_path, docs=4000, shards=4)
    expected = dump_digests(cfg, 10_000, lanes="0")[0]
    with server(["--config", str(cfg), "--max-ahead", "2"], tmp_path) as srv:
        assert len(read(srv.stub(), 0, count=3)[0]) == 3
        for i in range(4):
            rewrite_same_size(tmp_path / "web" / f"part-{i:05d}.jsonl")
        batches, err = read(srv.stub(), 0)
    assert err is not None, f"the lane ended after {len(batches)} of {len(expected)} batches"
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "changed after it was indexed (modified time" in err.details(), err.details()
    assert str(tmp_path / "web" / "part-0000") in err.details()
    assert "Traceback" not in err.details()
    # Every batch served is one of the unchanged data; the rest were refused, not changed.
    assert len(batches) < len(expected)
    assert [b.chain_digest.hex() for b in batches] == expected[: len(batches)]
    return {
        "served": len(batches),
        "lane_batches": len(expected),
        "error": (err.code().name, err.details()),
    }
