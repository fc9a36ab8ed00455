"""Disks that misbehave under the server: a state directory that is a file or cannot be made,
a read-only one holding a crashed write's temp file, a port file that cannot be written, a
full index disk. Each is one line naming the path and the fix (or a warning where the server
can go on), never a traceback, and leaves nothing behind."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from zephon_server.engine import index_dir
from zephon_server.engine.checkpoint import CheckpointStore, ResumeState, StateDirNotWritable
from zephon_server.engine.errors import ConfigError, ZephonError
from zephon_server.serve_flags import _check_port_file
from zephon_server.service.server import _write_port_file


def test_a_state_dir_that_is_a_file_or_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=r"--state-dir .*afile is not a directory \(a file"):
        CheckpointStore(afile)
    with pytest.raises(ConfigError, match=r"--state-dir .*afile/state cannot be made: "):
        CheckpointStore(afile / "state")  # its parent is a file


def test_a_read_only_state_dir_with_a_crashed_writes_temp_file_still_opens(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    stray = tmp_path / ".ckpt-00000002.zck.abc.tmp"
    stray.write_bytes(b"half")
    real = Path.unlink

    def read_only(self: Path, missing_ok: bool = False) -> None:
        if self.name.endswith(".tmp"):
            raise OSError(errno.EROFS, "Read-only file system")
        real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", read_only)  # root writes anywhere: simulate the mount
    with caplog.at_level(logging.WARNING):
        store = CheckpointStore(tmp_path)  # --resume from a read-only copy of the state
    assert store.ids() == [] and stray.exists()
    assert any("cannot remove" in r.getMessage() for r in caplog.records)


def test_a_state_dir_replaced_by_a_file_while_serving_is_not_a_transient_error(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    store = CheckpointStore(state)
    state.rmdir()
    state.write_text("in the way")
    with pytest.raises(StateDirNotWritable, match="is not a directory any more"):
        store.save(ResumeState(fingerprint="f", components={}, lanes={}, num_lanes=1))


def test_a_port_file_the_server_could_not_write_is_refused_before_start_up(
    tmp_path: Path,
) -> None:
    with pytest.raises(ZephonError, match=r"--port-file .*: its directory .* does not exist"):
        _check_port_file(str(tmp_path / "missing" / "server.port"))
    with pytest.raises(ZephonError, match="is a directory"):
        _check_port_file(str(tmp_path))
    _check_port_file(str(tmp_path / "server.port"))  # fine
    with pytest.raises(ZephonError, match=r"cannot write it: .*the server stops"):
        _write_port_file(str(tmp_path / "gone" / "server.port"), 50051)
    _write_port_file(str(tmp_path / "server.port"), 50051)
    assert (tmp_path / "server.port").read_text() == "50051\n"
    assert [p.name for p in tmp_path.iterdir()] == ["server.port"]  # no temp file left


def test_a_full_index_disk_leaves_no_probe_file_per_start(tmp_path: Path, monkeypatch) -> None:
    def full(path: str, mode: str = "r") -> object:
        with open(path, mode) as fh:  # the file is made, then the write fails
            fh.write(b"")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index_dir, "open", full, raising=False)
    for _ in range(3):
        assert "No space left" in (index_dir.write_problem(str(tmp_path)) or "")
    assert os.listdir(tmp_path) == []
