"""Bad input: every RPC error case maps to its DESIGN §5 status (never UNKNOWN or a
traceback), random and malformed requests leave the server healthy, corrupt and incompatible
checkpoints are rejected naming expected and found values, and malformed data end to end
either fails naming the file and position or is skipped and counted on ``/metrics``.

The scenario functions return their figures for ``tools/reliability_report.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.scenarios.bad_input import (
    CASES,
    FUZZ_EXAMPLES,
    LONG,
    bad_config,
    check_case,
    check_corruptions,
    corruptions,
    foreign_state,
    run_fuzz,
    run_malformed_data,
    running_servers,
    unary_error,
    write_bad_corpus,
)
from zephon_testing.servers import ServerProcess, serve_once, write_config

# --------------------------------------------------------------------------------------------
# A server with a checkpoint at seq 3 of every lane, and one resumed from it
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def running(tmp_path_factory, corpus_dir):
    with running_servers(tmp_path_factory.mktemp("bad-input"), corpus_dir) as servers:
        yield servers


@pytest.mark.service
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "call", "code", "text"), CASES, ids=[c[0] for c in CASES])
def test_every_rpc_error_case_has_its_status_code(running, name, call, code, text):
    check_case(running, name, call, code, text)


# --------------------------------------------------------------------------------------------
# Random and malformed request fields (property-based)
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.timeout(300 if LONG else 120)
def test_random_malformed_requests_leave_the_server_healthy(running):
    figures = run_fuzz(running)
    assert figures["requests"] >= FUZZ_EXAMPLES


# --------------------------------------------------------------------------------------------
# Corrupt and incompatible checkpoints
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.timeout(120)
def test_every_truncation_and_bit_flip_is_rejected(running):
    figures = check_corruptions(running.state)
    assert figures["cases"] == len(running.state) * 9
    # A sample over the wire: DATA_LOSS / FAILED_PRECONDITION, the server unchanged.
    before = running.positions()
    cases = corruptions(running.state)
    for name, data in cases[:: max(1, len(cases) // 40)]:
        err = unary_error(running.stub.Resume, pb.ResumeRequest(state=data))
        assert err.code() in (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.FAILED_PRECONDITION), (
            name,
            err.code(),
            err.details(),
        )
    assert running.positions() == before
    running.assert_healthy()


@pytest.mark.service
@pytest.mark.timeout(120)
def test_corrupt_and_incompatible_checkpoint_files_at_startup(running, tmp_path, corpus_dir):
    cfg = write_config(tmp_path / "pipeline.yaml", corpus_dir)
    state = tmp_path / "state"
    state.mkdir()
    (state / "ckpt-00000001-good.zck").write_bytes(running.state)
    (state / "ckpt-00000002-torn.zck").write_bytes(running.state[: len(running.state) // 2])
    (state / "ckpt-00000003-empty.zck").write_bytes(b"")
    # --resume latest skips the damaged newer files and resumes the newest intact one.
    srv = ServerProcess(
        ["--config", str(cfg), "--state-dir", str(state), "--resume", "latest"], tmp_path
    )
    try:
        info = srv.stub().GetInfo(pb.GetInfoRequest(), timeout=10)
        assert {p.lane: p.next_seq for p in info.acknowledged} == dict.fromkeys(range(4), 3)
        log = srv.output()
        assert "skipping corrupt checkpoint ckpt-00000003-empty" in log
        assert "skipping corrupt checkpoint ckpt-00000002-torn" in log
    finally:
        assert srv.terminate() == 0
    # A named damaged checkpoint, or one of another pipeline, stops the start with code 2.
    foreign = tmp_path / "foreign.zck"
    foreign.write_bytes(foreign_state(running.other_cfg))
    older = Path(__file__).parents[1] / "data" / "checkpoint-format-2.zck"  # by Zephon 0.1
    expected = {
        "ckpt-00000002-torn": "checksum mismatch: the file is truncated or corrupted (expected",
        "ckpt-00000003-empty": "truncated: 0 bytes, shorter than its 42-byte header",
        str(foreign): "checkpoint is from another pipeline: checkpoint fingerprint",
        str(older): "format version 2 (signed) is older than this server's 4: it was written by "
        "Zephon 0.1",
    }
    for resume, message in expected.items():
        res = serve_once(
            ["--config", str(cfg), "--state-dir", str(state), "--resume", resume], tmp_path
        )
        assert res.returncode == 2, (resume, res.stderr[-2000:])
        assert message in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]


# --------------------------------------------------------------------------------------------
# Malformed data end to end
# --------------------------------------------------------------------------------------------

MALFORMED = {3, 7, 11, 15, 18}


@pytest.mark.service
@pytest.mark.timeout(120)
def test_malformed_data_is_skipped_and_counted_per_policy(corpus_dir, tmp_path):
    figures = run_malformed_data(corpus_dir, tmp_path, "skip")
    assert "error" not in figures, figures.get("error")
    closed = figures["closed"]
    assert set(closed.values()) == {1}, "a document was closed twice"
    bad = {(s, r): t for (d, s, r, t) in closed if d == 1}
    m = figures["metrics"]
    # Every document of the bad dataset is closed exactly once on the wire (batches' closed,
    # then each lane's EndOfStream for records dropped after its last batch), and every drop
    # the server counted on /metrics reached the client with its reason.
    assert len(bad) == 40 + 120 + 120, len(bad)
    wire = figures["wire_dropped"]
    assert {r: wire.get(r, 0) for r in ("malformed", "read_error", "empty")} == {
        r: m[r] for r in ("malformed", "read_error", "empty")
    }, (wire, m)
    assert any(end.closed for end in figures["ends"].values()), "no lane ended on drops"
    assert m["malformed"] == len(MALFORMED), m
    # The empty document is closed once: delivered (the tokenizer adds special tokens) or
    # dropped as `empty` by the packer, per the pipeline.
    assert bad.get((0, 21), "empty") in ("", "empty") and m["empty"] <= 1
    assert {r for (s, r), t in bad.items() if s == 0 and t == "malformed"} <= MALFORMED
    assert bad.get((0, 25), "") == ""  # the huge document was delivered, never dropped
    assert (0, 25) in bad
    delivered = {(s, r) for (s, r), t in bad.items() if t == ""}
    assert delivered == {(s, r) for (d, s, r) in figures["rows"] if d == 1}
    assert all(t in ("", "read_error") for (s, _), t in bad.items() if s in (1, 2))
    assert m["read_error"] >= 120, m  # most of the two shards were read after they went away
    assert m["skipped"] == m["malformed"] + m["read_error"]
    assert figures["health"] == "SERVING"


@pytest.mark.service
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "damage", [(), ("vanish",), ("unreadable",)], ids=["bad-lines", "vanished", "unreadable"]
)
def test_malformed_data_fails_naming_file_and_position_under_fail_policy(
    corpus_dir, tmp_path, damage
):
    figures = run_malformed_data(corpus_dir, tmp_path, "fail", damage)
    assert "error" in figures, "the stream did not fail"
    code, message = figures["error"]
    assert code == "INTERNAL" and message.startswith("pipeline failed: "), figures["error"]
    path = figures["paths"]
    if not damage:  # the first malformed line, by file and line, and how to skip instead
        assert any(f"{path['bad']}:line {i + 1}: " in message for i in MALFORMED), message
        assert "on_error: skip" in message
    else:
        shard = path[damage[0]]
        assert f"cannot read shard {shard}: [Errno" in message, message
    assert "Traceback" not in message
    assert figures["health"] == "NOT_SERVING"


@pytest.mark.service
@pytest.mark.timeout(60)
def test_unreadable_shard_at_startup_names_the_file(corpus_dir, tmp_path):
    shards = write_bad_corpus(tmp_path / "data")
    broken = shards["bad"].parent / "part-3.jsonl.zst"
    broken.write_bytes(b"(\xb5/\xfd" + os.urandom(64))  # zstd magic, garbage frame
    cfg = bad_config(tmp_path / "b.yaml", corpus_dir, shards["bad"].parent, "skip")
    res = serve_once(["--config", str(cfg)], tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert str(broken) in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
