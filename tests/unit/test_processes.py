"""The processes runner: spawn workers, shared-memory handles, crashes named, no leaks: the hermetic
tests.

The tests of the same topic that need a subprocess, worker processes, a socket or the wall clock are
in ``tests/service/test_processes.py``.
"""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from zephon_server.engine import shm, shm_owner


def test_resolve_skips_the_scan_until_a_handle_is_made_or_unpickled(monkeypatch):
    """A process that never saw a handle (threads/inline runners) returns elements unscanned;
    making a handle (worker side) or unpickling one (main process) turns resolving on."""
    import pickle

    monkeypatch.setattr(shm, "_handles", False)

    class Exploding(dict):
        def items(self):
            raise AssertionError("payload scanned")

    from zephon_server.engine.records import SampleMeta, SampleRecord

    elems = [SampleRecord(Exploding(text="x"), SampleMeta(0, (0, 0), 0))]
    assert shm.resolve_payloads(elems) is elems  # no scan: no handle exists here
    wire = pickle.dumps(shm.ShmHandle("blk", 0, "<i4", (3,)))
    monkeypatch.setattr(shm, "_handles", False)
    pickle.loads(wire)
    assert shm._handles  # an unpickled handle (a worker's result) enables resolving
    monkeypatch.setattr(shm, "_handles", False)
    shm.ShmHandle("blk", 0, "<i4", (3,))
    assert shm._handles


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """A fresh directory as /dev/shm and no owner registered in this process."""
    monkeypatch.setattr(shm_owner, "SHM_DIR", tmp_path)
    monkeypatch.setattr(shm_owner, "_registration", None)
    monkeypatch.setattr(shm_owner, "_unavailable", False)
    return tmp_path


def owner_file(directory, owner: str, lines=(), *, locked: bool):
    """An owner file listing ``lines``; returns the fd holding its lock when ``locked``."""
    path = directory / f"{shm_owner.OWNER_PREFIX}{owner}"
    path.write_text("zephon shared-memory owner: pid 1\n" + "".join(lines))
    if not locked:
        return None
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_sweep_removes_dead_owners_blocks_and_semaphores_and_nothing_else(shm_dir):
    dead, live, gone = "111-aaaaaaaaaaaa", "222-bbbbbbbbbbbb", "333-cccccccccccc"
    # The dead owner died writing its file: the cut-short last line is no name to remove.
    owner_file(shm_dir, dead, ["sem.mp-dead0001\n", "sem.mp-dea"], locked=False)
    fd = owner_file(shm_dir, live, ["sem.mp-live0001\n"], locked=True)
    entries = [
        f"zephon-blk-{dead}-00000001",
        f"zephon-blk-{dead}-00000002",
        "sem.mp-dead0001",
        "sem.mp-dea",
        f"zephon-blk-{live}-00000003",
        "sem.mp-live0001",
        f"zephon-blk-{gone}-00000004",  # owner file already gone: an orphan
        "psm_0badc0de",  # not attributable: other programs make these too
        "sem.mp-unlisted",
        "zephon-ring-111-0-abcdef",
        "zephon-blk-111-aaaaaaaaaaaa",  # not a block name
    ]
    for name in entries:
        (shm_dir / name).write_bytes(b"x")
    try:
        assert shm_owner.sweep_stale() == 5
    finally:
        os.close(fd)
    assert sorted(os.listdir(shm_dir)) == sorted(
        [
            "sem.mp-dea",
            f"zephon-owner-{live}",
            f"zephon-blk-{live}-00000003",
            "sem.mp-live0001",
            "psm_0badc0de",
            "sem.mp-unlisted",
            "zephon-ring-111-0-abcdef",
            "zephon-blk-111-aaaaaaaaaaaa",
        ]
    )


def test_an_owner_holds_its_file_locked_lists_semaphores_and_removes_it_at_exit(shm_dir):
    owner = shm_owner.owner_id()
    assert owner is not None and owner.startswith(f"{os.getpid()}-")
    assert shm_owner.owner_id() == owner  # once per process
    assert shm_owner.block_name().startswith(f"zephon-blk-{owner}-")
    (shm_dir / "sem.mp-pool0001").write_bytes(b"x")
    shm_owner.record_semaphores({"sem.mp-pool0001"})
    path = shm_dir / f"zephon-owner-{owner}"
    assert path.read_text().splitlines()[1:] == ["sem.mp-pool0001"]
    assert shm_owner.sweep_stale() == 0  # its own
    assert shm_owner._sweep(own=None) == 0  # as another process sees it: locked, alive
    assert path.exists() and (shm_dir / "sem.mp-pool0001").exists()
    shm_owner._retire(shm_owner._registration)  # what atexit runs
    assert not path.exists()


def test_a_worker_names_blocks_after_the_owner_it_adopts(shm_dir):
    shm_owner.adopt("42-0123456789ab")
    assert shm_owner.owner_id() == "42-0123456789ab"
    assert shm_owner.block_name().startswith("zephon-blk-42-0123456789ab-")
    assert os.listdir(shm_dir) == []  # a worker makes no owner file of its own


def test_without_a_usable_dev_shm_blocks_get_default_names_and_a_warning(
    shm_dir, monkeypatch, caplog
):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(shm_owner.fcntl, "flock", no_locks)
    assert shm_owner.owner_id() is None
    assert shm_owner.block_name() is None  # multiprocessing names the block (psm_...)
    assert os.listdir(shm_dir) == []
    assert "cannot be removed by a later start-up if it is killed" in caplog.text
