"""Shard identity: a shard is its file's size and modification time. A same-size in-place
rewrite changes the fingerprint, a resume onto changed shards is refused naming the shard and
the change (from the shard manifest next to the checkpoint), and a shard that changes under
a run is never read through its old index, whatever its format.

The server-level scenarios (``zephon serve --resume latest``, the Resume RPC, a rewrite while
serving, ``zephon dump``) are in ``test_shard_identity_service.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zephon_server.engine.checkpoint import (
    IncompatibleCheckpoint,
    ResumeState,
)
from zephon_server.engine.corpus import write_jsonl
from zephon_server.engine.datasets import DatasetSpec, ShardInfo
from zephon_server.engine.errors import ShardChanged, ZephonError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.identity import (
    describe_change,
    format_ns,
    local_identity,
    object_identity,
)
from zephon_server.engine.manifest import (
    ShardManifest,
    load_manifest,
    save_manifest,
)
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.shards import ShardCache
from zephon_testing.scenarios.shard_identity import rewrite_same_size

pytestmark = pytest.mark.timeout(60)

ROWS = [json.dumps({"text": f"doc {i} alpha beta gamma " + "delta " * (i % 5)}) for i in range(120)]
INLINE = ExecutionConfig(runner="inline")


def write_corpus(root: Path, shards: int = 4, rows: list[str] = ROWS) -> list[DatasetSpec]:
    """A ``web`` dataset of ``shards`` plain JSONL files under ``root/web``."""
    per = len(rows) // shards
    for i in range(shards):
        write_jsonl(root / "web" / f"part-{i:05d}.jsonl", rows[i * per : (i + 1) * per])
    return [DatasetSpec("web", str(root / "web"), 1.0)]


def pipeline(specs: list[DatasetSpec]) -> Pipeline:
    return (
        Pipeline(specs, seed=3, lanes=2, chunk_size=4, flush_every_k_chunks=2)
        .decode_text()
        .tokenize(tokenizer="byte")
        .batch(microbatch_size=2)
    )


def take(run, n: int) -> list[NumberedBatch]:
    out: list[NumberedBatch] = []
    for item in run:
        if isinstance(item, NumberedBatch):
            out.append(item)
            if len(out) == n:
                break
    return out


def test_same_size_rewrite_changes_the_fingerprint(tmp_path: Path) -> None:
    specs = write_corpus(tmp_path)
    before = pipeline(specs).plan(INLINE)
    shard = tmp_path / "web" / "part-00001.jsonl"
    original, st = shard.read_bytes(), shard.stat()
    rewrite_same_size(shard)
    after = pipeline(specs).plan(INLINE)
    assert after.fingerprint != before.fingerprint
    differing = {k for k in after.components if after.components[k] != before.components.get(k)}
    assert differing == {"shards:web"}  # the data, not the dataset's settings
    assert after.datasets[0].shards[1].num_rows == before.datasets[0].shards[1].num_rows
    # The same bytes at the same time are the same identity: the fingerprint comes back.
    shard.write_bytes(original)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert pipeline(specs).plan(INLINE).fingerprint == before.fingerprint


def test_a_shard_changed_after_indexing_is_never_read_even_under_skip(tmp_path: Path) -> None:
    specs = [DatasetSpec("web", str(write_corpus(tmp_path)[0].path), 1.0, on_error="skip")]
    run = pipeline(specs).run(INLINE)  # planning listed and indexed every shard
    for i in range(4):
        rewrite_same_size(tmp_path / "web" / f"part-{i:05d}.jsonl")
    with pytest.raises(ZephonError, match=r"shard .*part-0000\d\.jsonl changed after it was index"):
        take(run, 1000)
    run.close()


def test_plain_jsonl_reads_compare_the_open_files_identity(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    st = path.stat()
    info = ShardInfo(str(path), "jsonl", st.st_size, len(ROWS), st.st_mtime_ns)
    cache = ShardCache()
    assert cache.read_rows(info, [0, 5], "text") == [ROWS[0].encode(), ROWS[5].encode()]
    rewrite_same_size(path)
    with pytest.raises(ShardChanged) as err:
        cache.read_rows(info, [0], "text")  # the index is cached: the fstat catches it
    new = path.stat()
    assert f"shard {path} changed after it was indexed (modified time " in str(err.value)
    assert f"-> {format_ns(new.st_mtime_ns)}, size {st.st_size} bytes unchanged)" in str(err.value)
    assert "restart the server" in str(err.value)
    # The new version is another identity: counted and indexed again, read correctly.
    fresh = ShardInfo(str(path), "jsonl", new.st_size, len(ROWS), new.st_mtime_ns)
    assert cache.num_rows(str(path), "jsonl", fresh.identity) == len(ROWS)
    assert cache.read_rows(fresh, [0], "text") == [ROWS[0].replace("a", "e").encode()]


def test_a_rewrite_keeping_size_and_time_is_refused_where_its_lines_moved(tmp_path: Path) -> None:
    # The identity cannot see it; reading through the old offsets would cut rows mid-line
    # (a "bad JSON" blamed on a valid row, or rows lost under skip). Rows' bytes must be lines.
    path = write_jsonl(tmp_path / "a.jsonl", ['{"text": "aaaa"}', '{"text": "bb"}'])
    st = path.stat()
    info = ShardInfo(str(path), "jsonl", st.st_size, 2, st.st_mtime_ns)
    cache = ShardCache()
    assert cache.read_rows(info, [1], "text") == [b'{"text": "bb"}']
    path.write_bytes(b'{"text": "xx"}\n{"text": "yyyy"}\n')  # same size, lines moved
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    for row in (0, 1):  # other data, as a changed identity is: never skipped
        with pytest.raises(ShardChanged, match=r"a.jsonl: the row indexed at bytes .* is not a"):
            cache.read_rows(info, [row], "text")


def test_an_unreadable_shard_under_skip_is_logged_once_and_every_row_counted(
    tmp_path: Path, caplog
) -> None:
    specs = [
        DatasetSpec("web", str(write_corpus(tmp_path, shards=2)[0].path), 1.0, on_error="skip")
    ]
    run = pipeline(specs).run(INLINE)  # planning listed and indexed both shards
    (tmp_path / "web" / "part-00001.jsonl").unlink()
    with caplog.at_level("WARNING", logger="zephon_server.engine.ops.fetch"):
        batches = take(run, 10_000)
    lines = [r for r in caplog.records if "rows of unreadable shard" in r.getMessage()]
    assert len(lines) == 1 and "part-00001.jsonl" in lines[0].getMessage()
    assert run.stats()["skipped"] == {"web": 60}  # every row of the deleted shard, counted
    assert batches  # the other shard's rows are delivered
    run.close()


def test_a_dataset_whose_every_shard_is_gone_fails_even_under_skip(tmp_path: Path) -> None:
    """Skipping is for bad records and shards: a dataset none of whose shards can be read any
    more would, under ``repeat``, be skipped forever without a batch (the server spun)."""
    path = write_corpus(tmp_path, shards=2)[0].path
    specs = [DatasetSpec("web", str(path), 1.0, on_error="skip", exhaustion="repeat")]
    run = pipeline(specs).run(INLINE)  # planning listed and indexed both shards
    for shard in ("part-00000.jsonl", "part-00001.jsonl"):
        (tmp_path / "web" / shard).unlink()
    with pytest.raises(ZephonError, match=r"dataset 'web': none of its 2 shards can be read"):
        take(run, 10_000)
    run.close()


def test_a_dataset_whose_every_shard_is_gone_ends_under_stop_with_every_row_counted(
    tmp_path: Path, caplog
) -> None:
    """Under ``exhaustion: stop`` such a dataset ends (it cannot spin): every row is skipped
    and counted, and the end says that every record was skipped."""
    path = write_corpus(tmp_path, shards=2)[0].path
    specs = [DatasetSpec("web", str(path), 1.0, on_error="skip", exhaustion="stop")]
    run = pipeline(specs).run(INLINE)
    for shard in ("part-00000.jsonl", "part-00001.jsonl"):
        (tmp_path / "web" / shard).unlink()
    with caplog.at_level("WARNING"):
        assert take(run, 10_000) == []
    assert run.stats()["skipped"] == {"web": len(ROWS)}
    assert any("every record skipped" in r.getMessage() for r in caplog.records)
    run.close()


def test_a_file_changing_while_it_is_indexed_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Unit test of the shard cache: the index is built between two stats."""
    from zephon_server.engine import shards as shards_mod

    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    real = shards_mod.index_lines

    def index_then_touch(p: str):
        starts = real(p)
        os.utime(p, ns=(0, path.stat().st_mtime_ns + 1))
        return starts

    monkeypatch.setattr(shards_mod, "index_lines", index_then_touch)
    with pytest.raises(ShardChanged, match=f"shard {path} changed while it was being read"):
        ShardCache().num_rows(str(path), "jsonl")


SHARD_IDENTITY = "identifies every shard by its size and modification time"
OWN_ORDER = "orders shards, rows and lanes with Zephon's own permutation instead of numpy's"


@pytest.mark.parametrize(
    ("version", "why"),
    [(None, f"{SHARD_IDENTITY}; and {OWN_ORDER}"), ("2", OWN_ORDER)],
    ids=["version-1", "version-2"],
)
def test_checkpoint_of_a_previous_fingerprint_version_is_refused_saying_why(
    tmp_path: Path, version: str | None, why: str
) -> None:
    specs = write_corpus(tmp_path)
    run = pipeline(specs).run(INLINE)
    take(run, 2)
    run.close()
    old = run.checkpoint()
    if version is None:
        old.components.pop("fingerprint_version")  # as version 1 wrote them
    else:
        old.components["fingerprint_version"] = version
    old.fingerprint = "0" * 64
    with pytest.raises(IncompatibleCheckpoint) as info:
        pipeline(specs).run(INLINE, resume=old)
    assert str(info.value).startswith(
        f"checkpoint was taken with fingerprint version {version or 1} and this server "
        f"computes version 3 (which {why}), so it cannot be checked"
    )


def test_manifest_round_trip_and_damaged_manifests_only_lose_detail(tmp_path: Path) -> None:
    specs = write_corpus(tmp_path / "data")
    plan = pipeline(specs).plan(INLINE)
    manifest = ShardManifest.of(plan.fingerprint, plan.datasets)
    path = save_manifest(tmp_path / "m", manifest)
    assert path == tmp_path / "m" / f"{plan.fingerprint}.json"
    assert load_manifest([tmp_path / "nowhere", tmp_path / "m"], plan.fingerprint) == manifest
    path.write_bytes(b"{not json")
    assert load_manifest([tmp_path / "m"], plan.fingerprint) is None  # logged, then ignored
    state = plan_state(plan)
    rewrite_same_size(tmp_path / "data" / "web" / "part-00002.jsonl")
    changed = pipeline(specs).plan(INLINE)
    with pytest.raises(IncompatibleCheckpoint) as info:
        state.check_compatible(
            changed.fingerprint,
            changed.components,
            datasets=changed.datasets,
            manifest_dirs=[tmp_path / "m"],
        )
    message = str(info.value)
    assert "dataset 'web': its shard list, or a shard's size, modification time or row " in message
    assert f"no shard manifest {plan.fingerprint[:16]}... found in {tmp_path / 'm'}" in message
    assert "cp -p" in message


def plan_state(plan) -> ResumeState:
    from zephon_server.engine.run import PipelineRun

    run = PipelineRun(plan)
    take(run, 1)
    run.close()
    return run.checkpoint()


def test_describe_change_reads_like_the_messages() -> None:
    a = local_identity(100, 1_767_225_600_000_000_000)
    b = local_identity(120, 1_767_225_601_500_000_000)
    assert describe_change(a, b) == (
        "modified time 2026-01-01T00:00:00.000000000Z -> 2026-01-01T00:00:01.500000000Z, "
        "size 100 -> 120 bytes"
    )
    assert describe_change(a, local_identity(100, 1)).endswith("size 100 bytes unchanged")
    # a checkpoint of objects resumed on a local copy (or the reverse) says so
    obj = object_identity(100, '"9b2c"')
    assert describe_change(obj, a) == (
        "an object (ETag) then, a local file (modified time) now, size 100 bytes: a checkpoint "
        "cannot move between object storage and local disk, as shards there are identified "
        "differently; resume with the dataset path it was taken on"
    )
    assert describe_change(b, obj).startswith(
        "a local file (modified time) then, an object (ETag) now, size 120 -> 100 bytes: "
    )


def test_rows_of_a_multi_frame_zstd_shard_are_checked_to_be_lines_too() -> None:
    # A multi-frame .jsonl.zst is read frame by frame through its indexed line starts; a
    # rewrite keeping the size and time (each frame the same length) moved its lines.
    import numpy as np

    from zephon_server.engine.zstd_frames import frame_rows

    old = [b'{"t": "aaaa"}\n{"t": "bb"}\n', b'{"t": "cc"}\n{"t": "d"}']  # no final newline
    new = [b'{"t": "xx"}\n{"t": "yyyy"}\n', old[1]]
    content = b"".join(old)
    starts = np.array([0, *[i + 1 for i, c in enumerate(content) if c == 10], len(content) + 1])
    frames = np.array([[0, 0, 0], [0, 0, len(old[0])]])  # the decompressed offsets count

    def rows(frames_content: list[bytes], idx: list[int]) -> list[bytes | int]:
        return frame_rows(
            "s.jsonl.zst", starts, frames, np.array(idx), frames_content.__getitem__, None
        )

    assert rows(old, [0, 1, 2, 3]) == [
        b'{"t": "aaaa"}',
        b'{"t": "bb"}',
        b'{"t": "cc"}',
        b'{"t": "d"}',
    ]
    for row in (0, 1):  # other data, as in a plain JSONL shard: never skipped
        with pytest.raises(
            ShardChanged, match=r"s.jsonl.zst: the row indexed at bytes .* is not a"
        ):
            rows(new, [row])
    assert rows(new, [2, 3]) == [b'{"t": "cc"}', b'{"t": "d"}']  # the frame that stayed
