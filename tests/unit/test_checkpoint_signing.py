"""Signed checkpoints (HMAC-SHA256) and the search for the latest usable checkpoint.

Unit tests of ``engine/checkpoint.py`` and ``engine/checkpoint_key.py`` over real files: a
forged checkpoint (payload edited, checksum recomputed, as anyone can) passes the checksum and
is refused only by a key; unsigned files keep loading without one. ``pick_latest`` skips
damage and stops at a checkpoint refused for what it is. The real-server side is in
``tests/reliability/test_startup.py``.
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import pytest

from zephon_server.engine.checkpoint import (
    FORMAT_VERSION,
    MAGIC,
    SIGNED_VERSION,
    BadSignature,
    CheckpointStore,
    CorruptCheckpoint,
    InaccessibleCheckpoint,
    IncompatibleCheckpoint,
    ResumeState,
    UnknownCheckpoint,
    UnreadableCheckpoint,
    UnsignedCheckpoint,
    read_state_file,
)
from zephon_server.engine.checkpoint_key import CheckpointKey
from zephon_server.engine.errors import ConfigError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline
from zephon_server.serve_flags import CHECKPOINT_KEY_ENV, checkpoint_key_from_args
from zephon_testing.scenarios.checkpoint_signing import forge

KEY_A = CheckpointKey(b"a" * 32, "test key A")
KEY_B = CheckpointKey(b"b" * 32, "test key B")


@pytest.fixture(scope="module")
def state(corpus_specs) -> ResumeState:
    pipe = (
        Pipeline(corpus_specs, seed=3, lanes=2, chunk_size=8, flush_every_k_chunks=2)
        .decode_text()
        .tokenize()
        .batch(microbatch_size=2)
    )
    run = pipe.run(ExecutionConfig(runner="inline"))
    n = 0
    for item in run:
        n += isinstance(item, NumberedBatch)
        if n == 4:
            break
    run.close()
    return ResumeState.decode(run.checkpoint().encode())


def retag(doc: dict) -> None:
    doc["tag"] = "forged"
    doc["lanes"]["0"]["next_seq"] += 1


def test_signed_checkpoint_is_32_bytes_more_and_round_trips(state):
    plain, signed = state.encode(), state.encode(KEY_A)
    assert struct.unpack_from("<H", plain, 8)[0] == FORMAT_VERSION == 3  # own data order
    assert struct.unpack_from("<H", signed, 8)[0] == SIGNED_VERSION == 4
    assert len(signed) == len(plain) + 32
    for data in (plain, signed):
        assert ResumeState.decode(data).to_json() == state.to_json()  # no key: both load
    assert ResumeState.decode(signed, KEY_A).to_json() == state.to_json()


def test_a_forged_checkpoint_passes_the_checksum_and_only_a_key_refuses_it(state):
    for original in (state.encode(), state.encode(KEY_A)):
        forged = forge(original, retag)
        assert ResumeState.decode(forged).tag == "forged"  # without a key: accepted
        with pytest.raises((BadSignature, UnsignedCheckpoint)):
            ResumeState.decode(forged, KEY_A)
    with pytest.raises(BadSignature, match=r"signature does not match \(forged, or signed with"):
        ResumeState.decode(forge(state.encode(KEY_A), retag), KEY_A)


def test_unsigned_or_other_key_refused_with_a_key(state):
    with pytest.raises(UnsignedCheckpoint, match="checkpoint is not signed; this server requires"):
        ResumeState.decode(state.encode(), KEY_A)
    with pytest.raises(BadSignature, match="the key given is from test key B"):
        ResumeState.decode(state.encode(KEY_A), KEY_B)
    # A signed header cut short, or damage under the MAC, is damage, not a forgery.
    signed = state.encode(KEY_A)
    with pytest.raises(CorruptCheckpoint, match="shorter than its 74-byte signed header"):
        ResumeState.decode(signed[:60], KEY_A)
    flipped = bytearray(signed)
    flipped[-5] ^= 1
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        ResumeState.decode(bytes(flipped), KEY_A)
    # Stripping the MAC (claiming the unsigned version) makes it unsigned: still refused.
    stripped = MAGIC + struct.pack("<H", FORMAT_VERSION) + signed[10:42] + signed[74:]
    assert ResumeState.decode(stripped).tag == state.tag
    with pytest.raises(UnsignedCheckpoint):
        ResumeState.decode(stripped, KEY_A)


def test_keys_come_from_a_file_or_the_environment_and_are_checked(tmp_path):
    key_file = tmp_path / "checkpoint.key"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")
    args = argparse.Namespace(checkpoint_key_file=str(key_file))
    from_file = checkpoint_key_from_args(args, {CHECKPOINT_KEY_ENV: "another key, ignored"})
    assert from_file is not None and from_file.secret == b"0123456789abcdef0123456789abcdef"
    assert "0123" not in repr(from_file)  # never in a log line
    none = argparse.Namespace(checkpoint_key_file=None)
    from_env = checkpoint_key_from_args(none, {CHECKPOINT_KEY_ENV: " an environment key! "})
    assert from_env == CheckpointKey(b"an environment key!", CHECKPOINT_KEY_ENV)
    assert checkpoint_key_from_args(none, {}) is None
    with pytest.raises(ConfigError, match="is 5 bytes; use at least 16"):
        checkpoint_key_from_args(none, {CHECKPOINT_KEY_ENV: "short"})
    with pytest.raises(ConfigError, match=r"missing\.key'?: the file does not exist"):
        CheckpointKey.from_file(tmp_path / "missing.key")
    with pytest.raises(ConfigError, match="is a directory, not a key file"):
        CheckpointKey.from_file(tmp_path)


def test_store_signs_what_it_saves_and_verifies_what_it_loads(tmp_path, state):
    signed = CheckpointStore(tmp_path, key=KEY_A)
    cid, data = signed.save(state)
    assert struct.unpack_from("<H", data, 8)[0] == SIGNED_VERSION
    assert signed.load(cid).to_json() == state.to_json()
    assert CheckpointStore(tmp_path).load(cid).to_json() == state.to_json()  # no key: reads
    with pytest.raises(BadSignature):
        CheckpointStore(tmp_path, key=KEY_B).load(cid)
    with pytest.raises(BadSignature):
        read_state_file(tmp_path / f"{cid}.zck", KEY_B)


def write_ids(directory, files: dict[str, bytes | None]) -> None:
    """Checkpoint files by id; None makes a directory under the name."""
    directory.mkdir(parents=True, exist_ok=True)
    for cid, data in files.items():
        path = directory / f"{cid}.zck"
        if data is None:
            path.mkdir()
        else:
            path.write_bytes(data)


def test_pick_latest_skips_damage_and_lists_it(tmp_path, state):
    good = state.encode()
    write_ids(
        tmp_path,
        {
            "ckpt-00000001-good": good,
            "ckpt-00000002-cut": good[:20],
            "ckpt-00000003-dir": None,
        },
    )
    store = CheckpointStore(tmp_path)
    pick = store.pick_latest()
    assert pick.found is not None and pick.found[0] == "ckpt-00000001-good"
    assert [r.checkpoint_id for r in pick.refused] == ["ckpt-00000003-dir", "ckpt-00000002-cut"]
    assert isinstance(pick.refused[0].error, UnreadableCheckpoint)
    assert "is a directory, not a file" in str(pick.refused[0])
    assert store.latest() is not None and store.latest()[0] == "ckpt-00000001-good"
    # Only damage: nothing found, every file listed; latest() is None as before.
    (tmp_path / "ckpt-00000001-good.zck").write_bytes(b"PK\x03\x04" + bytes(60))
    pick = CheckpointStore(tmp_path).pick_latest()
    assert pick.found is None and len(pick.refused) == 3
    assert "ckpt-00000001-good: not a Zephon checkpoint" in pick.describe()
    assert CheckpointStore(tmp_path).latest() is None


def test_pick_latest_stops_at_a_refusal_that_is_not_damage(tmp_path, state):
    write_ids(
        tmp_path,
        {
            "ckpt-00000001": state.encode(KEY_A),
            "ckpt-00000002": state.encode(KEY_A),
            "ckpt-00000003-unsigned": state.encode(),
        },
    )
    pick = CheckpointStore(tmp_path, key=KEY_A).pick_latest()
    assert pick.found is None and pick.untried == 2
    assert "ckpt-00000003-unsigned: checkpoint is not signed" in pick.describe()
    assert "2 older checkpoint(s) not tried" in pick.describe()
    with pytest.raises(UnsignedCheckpoint):
        CheckpointStore(tmp_path, key=KEY_A).latest()

    def another_pipeline(candidate: ResumeState) -> None:
        raise IncompatibleCheckpoint("checkpoint is from another pipeline: ...")

    pick = CheckpointStore(tmp_path).pick_latest(accept=another_pipeline)
    assert pick.found is None and pick.untried == 2
    assert "another pipeline" in pick.describe()


def test_unreadable_and_missing_files_are_named(tmp_path, monkeypatch, state):
    path = tmp_path / "ckpt-00000001.zck"
    path.write_bytes(state.encode())
    with pytest.raises(UnknownCheckpoint, match="does not exist"):
        read_state_file(tmp_path / "none.zck")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    # The tests run as root, who reads any file: simulate the permission error.
    monkeypatch.setattr(type(path), "read_bytes", denied)
    with pytest.raises(UnreadableCheckpoint, match="cannot be read: Permission denied"):
        read_state_file(path)
    pick = CheckpointStore(tmp_path).pick_latest()
    assert pick.found is None and "check its owner, mode" in pick.describe()


def test_a_newest_checkpoint_that_may_not_be_read_stops_the_search(tmp_path, monkeypatch, state):
    """A permission or I/O error is not damage: taking the older checkpoint behind it would
    roll the run back for a problem the operator can fix."""
    write_ids(tmp_path, {"ckpt-00000001": state.encode(), "ckpt-00000002": state.encode()})
    real = Path.read_bytes

    def denied(self):
        if self.name == "ckpt-00000002.zck":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)  # the tests run as root, who reads any file
    pick = CheckpointStore(tmp_path).pick_latest()
    assert pick.found is None and pick.untried == 1
    assert isinstance(pick.refused[0].error, InaccessibleCheckpoint)
    with pytest.raises(InaccessibleCheckpoint, match="cannot be read: Permission denied"):
        CheckpointStore(tmp_path).latest()
