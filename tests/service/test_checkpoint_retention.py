"""``zephon serve --keep-checkpoints N``: the state directory keeps the newest N checkpoints, a
deleted id is refused with NOT_FOUND naming the retention, and bad values fail at start-up."""

from __future__ import annotations

import grpc
import pytest

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.servers import serve_once, server, write_config


@pytest.mark.service
@pytest.mark.timeout(120)
def test_server_keeps_the_newest_checkpoints(corpus_dir, tmp_path):
    cfg = write_config(tmp_path / "pipeline.yaml", corpus_dir)
    state = tmp_path / "state"
    args = ["--config", str(cfg), "--state-dir", str(state), "--keep-checkpoints", "2"]
    with server(args, tmp_path) as srv:
        stub = srv.stub()
        ids = [
            stub.Checkpoint(pb.CheckpointRequest(tag=f"step{i}"), timeout=30).checkpoint_id
            for i in range(4)
        ]
        assert len(set(ids)) == 4
        assert sorted(p.name for p in state.glob("*.zck")) == [f"{c}.zck" for c in ids[-2:]]
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=10)
        assert list(info.checkpoint_ids) == ids[-2:]
        with pytest.raises(grpc.RpcError) as err:
            stub.Resume(pb.ResumeRequest(checkpoint_id=ids[0]), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "deleted: the server keeps only the newest 2" in err.value.details()
        assert "--keep-checkpoints" in err.value.details()
        stub.Resume(pb.ResumeRequest(checkpoint_id=ids[-1]), timeout=30)  # a kept one resumes
    assert "deleted checkpoint " + ids[1] in srv.output()


@pytest.mark.service
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--keep-checkpoints", "2"], "--keep-checkpoints needs --state-dir"),
        (["--state-dir", "st", "--keep-checkpoints", "-1"], "--keep-checkpoints must be"),
    ],
    ids=["without-state-dir", "negative"],
)
def test_bad_keep_checkpoints_fails_at_start_up(corpus_dir, tmp_path, extra, message):
    cfg = write_config(tmp_path / "pipeline.yaml", corpus_dir)
    res = serve_once(["--config", str(cfg), *extra], tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert message in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
