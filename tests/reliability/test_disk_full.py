"""A small, full state disk: checkpoints fill it, then RESOURCE_EXHAUSTED naming the fix; the
replay cache stays within its budget and never fails a checkpoint nor the pipeline; a
read-only state directory is FAILED_PRECONDITION. Real tmpfs filesystems of a few hundred KB.
"""

from __future__ import annotations

import pytest

from zephon_server.engine.checkpoint import (
    CheckpointStore,
    LaneState,
    NoSpaceForCheckpoint,
    ResumeState,
    StateDirNotWritable,
)
from zephon_testing.scenarios.disk_full import run_fill_a_small_disk
from zephon_testing.servers import serve_once
from zephon_testing.small_fs import remount, tmpfs


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


@pytest.mark.service
def test_paths_the_server_cannot_write_stop_the_start_in_one_line(stream_config, tmp_path):
    """A file where the state directory should be, a state directory on a read-only
    filesystem that does not exist yet, a port file in a read-only directory: exit status 2
    and one line naming the path and the fix, never a traceback."""
    cfg, _ = stream_config
    afile = tmp_path / "afile"
    afile.write_text("x")
    with tmpfs(tmp_path / "disk", "64k") as disk:
        (disk / "ports").mkdir()
        remount(disk, "ro")
        cases = [
            (["--state-dir", str(afile)], f"--state-dir {afile} is not a directory"),
            (["--state-dir", str(disk / "state")], "cannot be made: Read-only file system"),
            (["--port-file", str(disk / "ports" / "p")], "directory " + str(disk / "ports")),
        ]
        for args, says in cases:
            proc = serve_once(["--config", str(cfg), *args], tmp_path)
            assert proc.returncode == 2, proc.stderr
            assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
