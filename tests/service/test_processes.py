"""The processes runner: spawn workers, shared-memory handles, crashes named, no leaks."""

from __future__ import annotations

import errno
import fcntl
import os
import time

import pytest

from tests.support.builders import make_pipeline
from zephon_server.engine import shm, shm_owner
from zephon_server.engine.errors import ContractError, WorkerError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.accumulators import CountingAccumulator
from zephon_server.engine.ops.base import Operator, OpTraits

pytestmark = pytest.mark.processes


class CrashOnce(Operator):
    """Kills its worker process when it meets a given cursor."""

    op_name = "crash_once"

    def process_many(self, elems):
        if any(e.meta.cursor == (2, 5) for e in elems):
            os._exit(3)
        return elems


def test_crashed_worker_fails_the_run_naming_operator_and_exit_code(corpus_specs):
    pipe = make_pipeline(corpus_specs).apply(CrashOnce()).batch(microbatch_size=4)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        list(pipe.run(ExecutionConfig(runner="processes", workers=2)))
    assert time.monotonic() - start < 60
    message = str(info.value)
    assert "crash_once" in message
    assert "exit code 3" in message
    assert shm.live_blocks() == 0


class LengthCounter(Operator):
    """A custom stateful operator whose accumulator reads payload lengths."""

    op_name = "length_counter"

    def __init__(self, declare: bool, **kwargs):
        super().__init__(**kwargs)
        self.declare = declare

    def traits(self):
        return OpTraits(preserves_cursor_order=True, fusable=False)

    def accumulator(self, *, deterministic, ctx):
        declare = self.declare

        class Reading(CountingAccumulator):
            reads_payload = declare

            def push_many(self, elems):
                for e in elems:
                    if not e.meta.tombstone:
                        assert len(e.payload["input_ids"]) >= 0
                return super().push_many(elems)

        return Reading(8)

    def process_many(self, elems):
        return elems


def test_undeclared_payload_access_raises_a_clear_error(corpus_specs):
    pipe = make_pipeline(corpus_specs).apply(LengthCounter(False)).batch(microbatch_size=4)
    with pytest.raises(ContractError, match="reads_payload = True"):
        list(pipe.run(ExecutionConfig(runner="processes", workers=1)))


def test_declared_payload_access_gets_resolved_arrays_and_matches_inline(corpus_specs):
    def chains(ex):
        pipe = make_pipeline(corpus_specs).apply(LengthCounter(True)).batch(microbatch_size=4)
        return [(b.lane_id, b.seq, b.chain_digest) for b in pipe.run(ex).batches()]

    mine = f"{shm_owner.BLOCK_PREFIX}{shm_owner.owner_id()}-"  # this process's blocks
    assert chains(ExecutionConfig(runner="processes", workers=2)) == chains(
        ExecutionConfig(runner="inline")
    )
    assert shm.live_blocks() == 0
    assert [n for n in os.listdir("/dev/shm") if n.startswith(mine)] == []


def test_shared_memory_payloads_resolve_exactly_and_free_their_block():
    """Worker side exports arrays of several dtypes and shapes into one block; the main
    process resolves them in two goes: equal arrays, the block unlinked after its last one."""
    import numpy as np

    from zephon_server.engine.records import SampleMeta, SampleRecord

    records = [
        SampleRecord(
            {
                "input_ids": np.arange(i * 7, i * 7 + 3000, dtype=np.int32),
                "mask": np.arange(2 * 9, dtype=np.int64).reshape(2, 9) % 2 == 0,
                "text": f"doc {i}",
            },
            SampleMeta(0, (0, 0, i), 0),
        )
        for i in range(6)
    ]
    exported = shm.export_results(records)
    handles = [v for rec in exported for v in rec.payload.values() if type(v) is shm.ShmHandle]
    assert len(handles) == 12 and len({h.block for h in handles}) == 1
    block = handles[0].block
    assert block.startswith(f"{shm_owner.BLOCK_PREFIX}{shm_owner.owner_id()}-")
    shm.register_results(exported)
    shm.resolve_payloads(exported[:4])
    assert shm.live_blocks() == 1  # 4 handles left
    single = shm.resolve(exported[4].payload["input_ids"])
    exported[4].payload["input_ids"] = single
    shm.resolve_payloads(exported[4:])
    assert shm.live_blocks() == 0
    assert not os.path.exists(f"/dev/shm/{block}")
    for got, want in zip(exported, records):
        assert got.payload["text"] == want.payload["text"]
        for key in ("input_ids", "mask"):
            assert got.payload[key].dtype == want.payload[key].dtype
            assert np.array_equal(got.payload[key], want.payload[key])


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


# --------------------------------------------------------------------------------------------
# Owners of shared-memory blocks and the sweep (unit tests over a directory standing in for
# /dev/shm; flock conflicts between two open files of one process as between processes)
# --------------------------------------------------------------------------------------------


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
