"""Checkpoint files: atomic, checksummed; corrupt, truncated, foreign and newer ones refused."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from zephon_server.engine.checkpoint import (
    FORMAT_VERSION,
    MAGIC,
    SIGNED_VERSION,
    CheckpointStore,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    ResumeState,
    UnknownCheckpoint,
    read_state_file,
)
from zephon_server.engine.checkpoint_key import CheckpointKey
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline


def pipeline(specs, seed=1, microbatch=2):
    return (
        Pipeline(specs, seed=seed, lanes=2, chunk_size=8, flush_every_k_chunks=2)
        .decode_text()
        .tokenize()
        .shuffle(buffer_size=4)
        .batch(microbatch_size=microbatch)
    )


@pytest.fixture(scope="module")
def state_bytes(corpus_specs):
    run = pipeline(corpus_specs).run(ExecutionConfig(runner="inline"))
    n = 0
    for item in run:
        n += isinstance(item, NumberedBatch)
        if n == 6:
            break
    run.close()
    return run.checkpoint().encode()


def test_store_saves_atomically_and_loads_latest(tmp_path, state_bytes):
    store = CheckpointStore(tmp_path)
    (tmp_path / ".ckpt-00000009.zck.abc.tmp").write_bytes(b"partial")  # interrupted write
    store = CheckpointStore(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))
    state = ResumeState.decode(state_bytes)
    state.tag = "step 100"
    first, _ = store.save(state)
    second, data = store.save(state)
    assert store.ids() == [first, second] and second.endswith("-step_100")
    latest_id, latest = store.latest()
    assert latest_id == second and latest.encode() == data == state.encode()
    with pytest.raises(UnknownCheckpoint, match="unknown checkpoint id 'ckpt-99999999'"):
        store.load("ckpt-99999999")


def test_truncated_at_every_offset_is_refused(state_bytes):
    for cut in range(0, len(state_bytes), max(1, len(state_bytes) // 97)):
        with pytest.raises(CorruptCheckpoint):
            ResumeState.decode(state_bytes[:cut])


def test_bit_flips_are_refused(state_bytes):
    for pos in range(0, len(state_bytes), max(1, len(state_bytes) // 53)):
        flipped = bytearray(state_bytes)
        flipped[pos] ^= 0x10
        with pytest.raises((CorruptCheckpoint, IncompatibleCheckpoint)):
            ResumeState.decode(bytes(flipped))


def test_empty_and_foreign_files(tmp_path):
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        ResumeState.decode(b"")
    with pytest.raises(CorruptCheckpoint, match="not a Zephon checkpoint"):
        ResumeState.decode(b"PK\x03\x04" + bytes(60))
    with pytest.raises(UnknownCheckpoint, match="does not exist"):
        read_state_file(tmp_path / "missing.zck")


def test_newer_format_version_is_refused(state_bytes):
    newer = MAGIC + struct.pack("<H", 99) + state_bytes[10:]
    with pytest.raises(IncompatibleCheckpoint, match="version 99 is newer"):
        ResumeState.decode(newer)


# Written by Zephon 0.1 (format 1 unsigned, format 2 signed with b"a" * 32), whose data order
# came from numpy's random streams: a resume on the permutation of this server is refused.
ZEPHON_0_1 = {
    1: Path(__file__).parents[1] / "data" / "checkpoint-format-1.zck",
    2: Path(__file__).parents[1] / "data" / "checkpoint-format-2.zck",
}


@pytest.mark.parametrize(("version", "kind", "ours"), [(1, "unsigned", 3), (2, "signed", 4)])
def test_a_checkpoint_of_zephon_0_1_is_refused_naming_both_versions_and_the_fix(
    tmp_path, version, kind, ours
):
    assert (FORMAT_VERSION, SIGNED_VERSION) == (3, 4)
    expected = (
        f"checkpoint format version {version} ({kind}) is older than this server's {ours}: it "
        "was written by Zephon 0.1, whose data order came from numpy's random streams; this "
        "server orders shards, rows and lanes with its own permutation, so its positions would "
        "point at other data. Resume it with Zephon 0.1, or start a new run (without a resume)"
    )
    path = ZEPHON_0_1[version]
    for key in (None, CheckpointKey(b"a" * 32, "the key that signed it")):
        with pytest.raises(IncompatibleCheckpoint) as info:
            read_state_file(path, key)
        assert str(info.value) == expected
    # A store holding one stops the search for the latest (never resumed as another order).
    shutil.copy(path, tmp_path / "ckpt-00000001.zck")
    with pytest.raises(IncompatibleCheckpoint, match=f"format version {version} "):
        CheckpointStore(tmp_path).latest()
    # Damage is still reported as damage.
    damaged = bytearray(path.read_bytes())
    damaged[-3] ^= 1
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        ResumeState.decode(bytes(damaged))


def test_the_format_1_layout_is_the_format_3_layout_under_another_version(state_bytes):
    """What Zephon 0.1 wrote for this state: the same bytes with version 1 in the header."""
    assert struct.unpack_from("<H", state_bytes, 8)[0] == FORMAT_VERSION
    old = MAGIC + struct.pack("<H", 1) + state_bytes[10:]
    with pytest.raises(IncompatibleCheckpoint, match=r"format version 1 \(unsigned\) is older"):
        ResumeState.decode(old)


def test_fingerprint_mismatch_names_what_differs(corpus_specs, state_bytes):
    state = ResumeState.decode(state_bytes)
    other = pipeline(corpus_specs, seed=2, microbatch=3)
    with pytest.raises(IncompatibleCheckpoint) as info:
        other.run(ExecutionConfig(runner="inline"), resume=state)
    message = str(info.value)
    assert "seed (checkpoint 1, pipeline 2)" in message
    assert "op3:batch" in message
    assert state.fingerprint[:16] in message


def test_execution_settings_do_not_change_the_fingerprint(corpus_specs, state_bytes):
    state = ResumeState.decode(state_bytes)
    run = pipeline(corpus_specs).run(ExecutionConfig(runner="threads", workers=3), resume=state)
    first = {}
    for batch in run.batches():
        first.setdefault(batch.lane_id, batch.seq)
    assert first == {lane: st.next_seq for lane, st in state.lanes.items()}


def test_store_keeps_the_newest_n_and_names_deleted_ids(tmp_path, state_bytes):
    store = CheckpointStore(tmp_path, keep=2)
    state = ResumeState.decode(state_bytes)
    saved = []
    for i in range(5):
        state.tag = "tagged" if i == 3 else ""
        saved.append(store.save(state)[0])
    assert store.ids() == saved[-2:]  # tagged or not: the newest two
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{c}.zck" for c in saved[-2:]]
    with pytest.raises(UnknownCheckpoint, match="deleted: the server keeps only the newest 2"):
        store.load(saved[0])
    assert store.load(saved[-1]).encode() == state.encode()
    keep_all = CheckpointStore(tmp_path / "all")
    for _ in range(4):
        keep_all.save(state)
    assert len(keep_all.ids()) == 4
    with pytest.raises(ValueError, match="keep must be an integer >= 0"):
        CheckpointStore(tmp_path, keep=-1)


def test_concurrent_saves_get_distinct_ids(tmp_path, state_bytes):
    from concurrent.futures import ThreadPoolExecutor

    store = CheckpointStore(tmp_path)
    states = []
    for i in range(16):
        state = ResumeState.decode(state_bytes)
        state.tag = f"t{i}" if i % 2 else ""
        states.append(state)
    with ThreadPoolExecutor(8) as pool:
        saved = list(pool.map(store.save, states))
    ids = [cid for cid, _ in saved]
    assert len({cid[:13] for cid in ids}) == 16  # 16 distinct numbers, none overwritten
    for (cid, data), state in zip(saved, states, strict=True):
        assert store.load(cid).encode() == data == state.encode()
