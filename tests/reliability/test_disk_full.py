"""A small, full state disk: checkpoints fill it, then RESOURCE_EXHAUSTED naming the fix; the
replay cache stays within its budget and never fails a checkpoint nor the pipeline; a
read-only state directory is FAILED_PRECONDITION. Real tmpfs filesystems of a few hundred KB.
"""

from __future__ import annotations

import grpc
import pytest

from tests.reliability.test_faults import health_status
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.cache_budget import LEDGER_NAME, CacheBudget, tree_usage
from zephon_server.engine.checkpoint import (
    CheckpointStore,
    LaneState,
    NoSpaceForCheckpoint,
    ResumeState,
    StateDirNotWritable,
)
from zephon_testing.servers import ServerProcess, read_lane, serve_once
from zephon_testing.small_fs import free_bytes, remount, tmpfs

LANES = 4


def small_state(tag: str = "") -> ResumeState:
    lanes = {i: LaneState(3, 0, None, (0, 1, 0), bytes(32)) for i in range(2)}
    return ResumeState("f" * 64, {"seed": "1"}, lanes, 2, tag=tag)


def test_a_full_state_dir_is_no_space_naming_the_directory_and_the_fix(tmp_path):
    with tmpfs(tmp_path / "disk", "64k") as disk:
        store = CheckpointStore(disk / "state", keep=0)
        saved = []
        with pytest.raises(NoSpaceForCheckpoint) as info:
            for i in range(100):
                saved.append(store.save(small_state(f"t{i}"))[0])
        message = str(info.value)
        assert message.startswith(f"no space left in {disk / 'state'} (")
        assert "free space on that filesystem or lower --keep-checkpoints (now 0: keep all)" in (
            message
        )
        assert 5 < len(saved) < 100
        assert not list((disk / "state").glob(".ckpt-*.tmp"))  # no partial file stays
        assert store.ids() == saved and all(store.load(cid) for cid in saved)


def test_a_read_only_state_dir_is_not_writable(tmp_path):
    with tmpfs(tmp_path / "disk", "64k") as disk:
        store = CheckpointStore(disk / "state")
        store.save(small_state())
        remount(disk, "ro")
        with pytest.raises(StateDirNotWritable, match="make --state-dir a writable directory"):
            store.save(small_state())
        assert len(store.ids()) == 1


def fill_with_checkpoints(stub, limit: int = 3000) -> tuple[int, grpc.RpcError]:
    """Checkpoint until one fails; (checkpoints saved, the error)."""
    for n in range(limit):
        try:
            stub.Checkpoint(pb.CheckpointRequest(tag=f"fill{n}"), timeout=20)
        except grpc.RpcError as err:
            return n, err
    raise AssertionError(f"{limit} checkpoints fit on the small disk")


def read_rest(stub, expected, start: int) -> None:
    """Every lane from ``start`` to its end equals the uninterrupted stream."""
    for lane in range(LANES):
        batches, end = read_lane(stub, lane, start, consumer="reader")
        assert end is not None
        got = [b.chain_digest.hex() for b in batches]
        assert got == expected[lane][start:], lane


DISK = "1m"  # the tmpfs of the state directory


def run_fill_a_small_disk(cfg, expected, tmp_path) -> dict[str, dict]:
    """Checkpoints until the 1 MiB state disk is full, with the replay cache on and off;
    checks RESOURCE_EXHAUSTED naming the directory and the fix, every lane intact afterwards,
    health SERVING, a read-only disk FAILED_PRECONDITION, the cache within its budget and
    taking at most that from the checkpoints. Returns per cache: checkpoints saved, the
    errors, the cache's use and budget."""
    counts = {}
    figures: dict[str, dict] = {}
    for cache in ("on", "off"):
        got: dict = {}
        with tmpfs(tmp_path / f"disk-{cache}", DISK) as disk:
            state = disk / "state"
            args = ["--config", str(cfg), "--state-dir", str(state), "--max-ahead", "2"]
            if cache == "off":
                args += ["--replay-cache", "off"]
            srv = ServerProcess(args, tmp_path)
            try:
                stub = srv.stub()
                for lane in range(LANES):
                    read_lane(stub, lane, 0, 3, "reader")  # acknowledged: 3 on every lane
                counts[cache], err = fill_with_checkpoints(stub)
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
                details = err.details()
                got["full"] = (err.code().name, details)
                got["free_bytes"] = free_bytes(disk)
                assert details.startswith(f"no space left in {state} ("), details
                assert "free space on that filesystem or lower --keep-checkpoints" in details
                assert free_bytes(disk) < 4096  # the checkpoints took the disk
                # The pipeline goes on, tokenizing with the disk full, and its data is intact.
                read_rest(stub, expected, 3)
                got["health"] = health_status(srv.address)
                assert got["health"] == "SERVING"
                if cache == "off":
                    remount(disk, "ro")
                    with pytest.raises(grpc.RpcError) as err:
                        stub.Checkpoint(pb.CheckpointRequest(), timeout=20)
                    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                    assert f"cannot write in {state}" in err.value.details()
                    got["read_only"] = (err.value.code().name, err.value.details())
                    remount(disk, "rw")
            finally:
                assert srv.terminate() == 0
            log = srv.output()
            assert "Traceback" not in log
            got["tracebacks"] = log.count("Traceback")
            got["log_lines"] = sum("checkpoint refused" in line for line in log.splitlines())
            assert got["log_lines"] <= 2
            assert sum("replay cache:" in line for line in log.splitlines()) <= 2
            if cache == "on":
                budget = CacheBudget.for_path(state / "replay-cache")
                used = tree_usage(state / "replay-cache", budget, skip=LEDGER_NAME)
                assert 0 < used <= budget.max_bytes
                got["cache_used"], got["cache_budget"] = used, budget.max_bytes
        got["saved"] = counts[cache]
        figures[cache] = got
    # The cache took at most its budget (a tenth of the disk) from the checkpoints.
    assert counts["on"] >= counts["off"] - (1 << 20) // 10 // 4096 - 2, counts
    assert counts["off"] > 100, counts
    return figures


@pytest.mark.service
@pytest.mark.timeout(240)
def test_checkpoints_fill_a_small_disk_then_resource_exhausted(
    tmp_path, stream_config, stream_expected
):
    run_fill_a_small_disk(stream_config[0], stream_expected, tmp_path)


@pytest.mark.service
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("lots", "--replay-cache-max-bytes must be a number of bytes with an optional K, M, G"),
        ("0", "--replay-cache-max-bytes must be more than 0"),
    ],
)
def test_a_bad_replay_cache_budget_fails_at_start_up(stream_config, tmp_path, value, message):
    cfg, _ = stream_config
    args = ["--config", str(cfg), "--state-dir", str(tmp_path), "--replay-cache-max-bytes", value]
    proc = serve_once(args, tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
