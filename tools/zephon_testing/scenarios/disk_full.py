"""The scenarios of ``tests/reliability/test_disk_full.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import grpc
import pytest

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.cache_budget import LEDGER_NAME, CacheBudget, tree_usage
from zephon_testing.scenarios.faults import health_status
from zephon_testing.servers import ServerProcess, read_lane
from zephon_testing.small_fs import free_bytes, remount, tmpfs

LANES = 4


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
