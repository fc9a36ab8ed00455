"""Shard identity: a shard is its file's size and modification time. A same-size in-place rewrite
changes the fingerprint, a resume onto changed shards is refused naming the shard and the change
(from the shard manifest next to the checkpoint), and a shard that changes under a run is never
read through its old index, whatever its format: the tests that need a subprocess, worker
processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_shard_identity.py``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.unit.test_shard_identity import INLINE, ROWS, pipeline, take, write_corpus
from zephon_server.engine.checkpoint import (
    IncompatibleCheckpoint,
    read_state_file,
    write_atomic,
)
from zephon_server.engine.corpus import write_jsonl, write_parquet
from zephon_server.engine.datasets import DatasetSpec, ShardInfo
from zephon_server.engine.errors import ShardChanged
from zephon_server.engine.manifest import (
    ShardManifest,
    manifest_dir,
    save_manifest,
)
from zephon_server.engine.shards import ShardCache

pytestmark = pytest.mark.timeout(60)


def checkpoint_with_manifest(specs: list[DatasetSpec], directory: Path) -> Path:
    """Run a few batches, then save the state file and its shard manifest in ``directory``
    (what ``zephon dump --save-state`` and a server's Checkpoint do)."""
    plan = pipeline(specs).plan(INLINE)
    from zephon_server.engine.run import PipelineRun

    run = PipelineRun(plan)
    take(run, 4)
    run.close()
    save_manifest(manifest_dir(directory), ShardManifest.of(plan.fingerprint, plan.datasets))
    path = directory / "state.zck"
    write_atomic(path, run.checkpoint().encode())
    return path


def test_copy_without_times_is_refused_naming_the_fix_and_a_copy_with_times_resumes(
    tmp_path: Path,
) -> None:
    state_file = checkpoint_with_manifest(write_corpus(tmp_path / "orig"), tmp_path)
    time.sleep(0.05)  # the plain copy's times are later than the originals'
    shutil.copytree(tmp_path / "orig", tmp_path / "plain", copy_function=shutil.copyfile)
    shutil.copytree(tmp_path / "orig", tmp_path / "kept")  # copy2: times preserved

    plain = pipeline([DatasetSpec("web", str(tmp_path / "plain" / "web"), 1.0)])
    with pytest.raises(IncompatibleCheckpoint) as info:
        plain.run(INLINE, resume=read_state_file(state_file))
    message = str(info.value)
    assert message.startswith("checkpoint does not match the data: the shards changed")
    for i in range(4):
        shard = tmp_path / "plain" / "web" / f"part-{i:05d}.jsonl"
        assert f"shard {shard} modified (modified time " in message
    size = (tmp_path / "orig" / "web" / "part-00000.jsonl").stat().st_size
    assert f"size {size} bytes unchanged, rows 30 unchanged" in message
    assert "cp without -p" in message and "cp -p" in message and "touch -r" in message

    kept = pipeline([DatasetSpec("web", str(tmp_path / "kept" / "web"), 1.0)])
    state = read_state_file(state_file)
    run = kept.run(INLINE, resume=state)  # moved with its times: the same shards
    first = take(run, 1)[0]
    run.close()
    assert first.seq == state.lanes[first.lane_id].next_seq


def test_compressed_and_parquet_shards_are_checked_when_loaded(tmp_path: Path) -> None:
    zst = write_jsonl(tmp_path / "b.jsonl.zst", ROWS)
    pq_path = write_parquet(tmp_path / "c.parquet", {"text": ROWS}, row_group_size=10)
    infos = {}
    for path, fmt in ((zst, "jsonl.zst"), (pq_path, "parquet")):
        st = path.stat()
        infos[fmt] = ShardInfo(str(path), fmt, st.st_size, len(ROWS), st.st_mtime_ns)
    small = ShardCache(max_bytes=0)  # keeps nothing: every read loads the shard again
    big = ShardCache()
    for cache in (small, big):
        assert cache.read_rows(infos["jsonl.zst"], [3], "text") == [ROWS[3].encode()]
        assert cache.read_rows(infos["parquet"], [3], "text") == [ROWS[3]]
    time.sleep(0.02)
    write_jsonl(zst, ROWS[::-1])  # replaced, as most tools write compressed files
    write_parquet(pq_path, {"text": ROWS[::-1]}, row_group_size=10)
    with pytest.raises(ShardChanged, match=f"shard {zst} changed after it was indexed"):
        small.read_rows(infos["jsonl.zst"], [3], "text")
    with pytest.raises(ShardChanged, match=f"shard {pq_path} changed after it was indexed"):
        small.read_rows(infos["parquet"], [3], "text")
    # Loaded row groups stay those of the indexed version; a row group not loaded yet is
    # checked as it loads.
    assert big.read_rows(infos["parquet"], [3], "text") == [ROWS[3]]
    with pytest.raises(ShardChanged, match=f"shard {pq_path} changed after it was indexed"):
        big.read_rows(infos["parquet"], [55], "text")
