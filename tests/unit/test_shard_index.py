"""The persisted shard index: a warm start reads no shard, a changed shard is re-indexed, a
damaged entry or catalog is rebuilt with a warning, concurrent writers never corrupt an
entry, multi-frame zstd shards are read frame by frame, and open line indexes are bounded.

Every "new process" here is a fresh :class:`ShardCache` on the same index directory (what a
restart or a worker process gets); the tests with real processes are marked ``service``.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard

from zephon_server.engine.corpus import write_jsonl, write_parquet
from zephon_server.engine.datasets import DatasetSpec, ShardInfo, resolve_datasets
from zephon_server.engine.decompression import IncompleteShardError
from zephon_server.engine.errors import ConfigError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.index_dir import IndexDir, open_index_dir, user_index_dir
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.shard_index import (
    CorruptIndexEntry,
    EntryKey,
    ShardIndex,
    decode_entry,
    encode_entry,
)
from zephon_server.engine.shards import ShardCache

pytestmark = pytest.mark.timeout(60)

ROWS = [json.dumps({"text": f"doc {i} " + "word " * (i % 13)}) for i in range(90)]
FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")


def write_shards(root: Path, fmt: str, shards: int = 3, rows: list[str] = ROWS) -> Path:
    """``shards`` files of format ``fmt`` under ``root/fmt`` (Parquet: a ``text`` column)."""
    per = len(rows) // shards
    for i in range(shards):
        part = rows[i * per : (i + 1) * per]
        path = root / fmt / f"part-{i:05d}.{fmt}"
        if fmt == "parquet":
            write_parquet(path, {"text": [json.loads(r)["text"] for r in part]}, row_group_size=7)
        else:
            write_jsonl(path, part)
    return root / fmt


def specs(root: Path) -> list[DatasetSpec]:
    return [DatasetSpec(fmt.replace(".", "_"), str(root / fmt), 1.0) for fmt in FORMATS]


def fresh(index_dir: Path, **kwargs: object) -> ShardCache:
    """A new process's cache on ``index_dir``."""
    return ShardCache(index=ShardIndex(IndexDir(str(index_dir))), **kwargs)  # type: ignore[arg-type]


def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for fmt in FORMATS:
        write_shards(root, fmt)
    return root


def overwrite_keeping_identity(path: Path) -> None:
    """Replace every byte of ``path`` with garbage of the same size and give it back its
    modification time: the same identity, other bytes (only a read would notice)."""
    st = path.stat()
    path.write_bytes(b"\xff" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def entry_files(index_dir: Path) -> list[Path]:
    return sorted(index_dir.glob("entries/*/*.zsi"))


# ------------------------------------------------------------------ warm start


def test_a_warm_start_reads_no_shard(tmp_path: Path) -> None:
    root, index_dir = corpus(tmp_path), tmp_path / "index"
    cold = fresh(index_dir)
    before = [d.num_rows for d in resolve_datasets(specs(root), cache=cold)]
    assert cold.stats()["index_writes"] == 12 and cold.stats()["catalog_writes"] == 4
    for shard in root.rglob("part-*"):
        overwrite_keeping_identity(shard)  # what a start that reads the shards would see
    warm = fresh(index_dir)
    infos = resolve_datasets(specs(root), cache=warm)
    assert [d.num_rows for d in infos] == before == [90, 90, 90, 90]
    stats = warm.stats()
    assert stats["catalog_hits"] == 4
    for name in ("index_builds", "decompressions", "footer_reads", "index_reads", "misses"):
        assert stats[name] == 0, (name, stats)
    # Without the catalog, the entries count the shards, still without reading one.
    for catalog in index_dir.glob("catalogs/*"):
        catalog.unlink()
    warm = fresh(index_dir)
    assert [d.num_rows for d in resolve_datasets(specs(root), cache=warm)] == before
    stats = warm.stats()
    assert stats["index_reads"] == 12 and stats["index_builds"] == stats["footer_reads"] == 0


def test_rows_read_through_a_warm_index_equal_a_cold_read(tmp_path: Path) -> None:
    root, index_dir = corpus(tmp_path), tmp_path / "index"
    cold, none = fresh(index_dir), ShardCache()
    resolve_datasets(specs(root), cache=cold)
    warm = fresh(index_dir)
    infos = resolve_datasets(specs(root), cache=warm)
    order = list(range(30))
    random.Random(5).shuffle(order)
    for info in infos:
        for shard in info.shards:
            assert warm.read_rows(shard, order, "text") == none.read_rows(shard, order, "text")
    stats = warm.stats()
    assert stats["index_writes"] == 0  # nothing indexed again; plain JSONL: stored offsets
    assert stats["decompressions"] == 6 and stats["footer_reads"] == 3  # to read, not count


def test_a_changed_shard_is_indexed_again_and_changes_the_fingerprint(tmp_path: Path) -> None:
    root, index_dir = tmp_path / "data", tmp_path / "index"
    write_shards(root, "jsonl")
    spec = [DatasetSpec("web", str(root / "jsonl"), 1.0)]
    pipe = Pipeline(spec, lanes=2).tokenize(tokenizer="byte").batch(microbatch_size=2)
    execution = ExecutionConfig(runner="inline", index_dir=str(index_dir))
    before = pipe.plan(execution)
    shard = root / "jsonl" / "part-00001.jsonl"
    data = shard.read_bytes()
    cut = data.index(b"\n") + 1  # one row fewer, same size: join the first two lines
    shard.write_bytes(data[: cut - 1] + b" " + data[cut:])
    while shard.stat().st_mtime_ns == before.datasets[0].shards[1].mtime_ns:
        time.sleep(0.01)
        os.utime(shard)
    cache = fresh(index_dir)
    (info,) = resolve_datasets(spec, cache=cache)
    assert [s.num_rows for s in info.shards] == [30, 29, 30]
    assert cache.stats()["index_builds"] == 1  # that shard alone; the others from the index
    assert cache.stats()["catalog_hits"] == 0  # another listing, another catalog
    after = pipe.plan(execution)
    assert after.fingerprint != before.fingerprint
    assert after.datasets[0].shards[1].num_rows == 29
    assert len(entry_files(index_dir)) == 4  # the old version's entry is another key


# ------------------------------------------------------------------ damage


def test_a_damaged_entry_is_rebuilt_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, index_dir = tmp_path / "data", tmp_path / "index"
    write_shards(root, "jsonl")
    spec = [DatasetSpec("web", str(root / "jsonl"), 1.0)]
    resolve_datasets(spec, cache=fresh(index_dir))
    flipped, cut, swapped = entry_files(index_dir)
    valid, other = flipped.read_bytes(), swapped.read_bytes()
    swapped.write_bytes(valid)  # an intact entry, but of another shard
    data = bytearray(valid)
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:-3])
    for catalog in index_dir.glob("catalogs/*"):
        catalog.unlink()
    caplog.set_level(logging.WARNING)
    cache = fresh(index_dir)
    (info,) = resolve_datasets(spec, cache=cache)
    assert [s.num_rows for s in info.shards] == [30, 30, 30]
    warned = [r.getMessage() for r in caplog.records if "is unusable" in r.getMessage()]
    assert len(warned) == 3, warned
    for path in (flipped, cut, swapped):
        assert any(str(path) in w and "rebuilding it from the shard" in w for w in warned)
    assert any(str(flipped) in w and "checksum mismatch" in w for w in warned)
    assert any(str(cut) in w and "no end mark" in w for w in warned)
    assert any(str(swapped) in w and "of another shard version" in w for w in warned)
    assert cache.stats()["index_builds"] == 3 and cache.stats()["index_corrupt"] == 3
    assert swapped.read_bytes() == other  # rewritten valid
    caplog.clear()
    again = fresh(index_dir)
    resolve_datasets(spec, cache=again)
    assert again.stats()["index_builds"] == 0 and not caplog.records


def test_a_damaged_catalog_is_recounted_from_the_entries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, index_dir = tmp_path / "data", tmp_path / "index"
    write_shards(root, "jsonl")
    spec = [DatasetSpec("web", str(root / "jsonl"), 1.0)]
    resolve_datasets(spec, cache=fresh(index_dir))
    (catalog,) = index_dir.glob("catalogs/*.zsc")
    catalog.write_bytes(catalog.read_bytes().replace(b"30", b"31", 1))
    caplog.set_level(logging.WARNING)
    cache = fresh(index_dir)
    (info,) = resolve_datasets(spec, cache=cache)
    assert info.num_rows == 90
    assert any(str(catalog) in r.getMessage() for r in caplog.records)
    assert cache.stats()["index_reads"] == 3 and cache.stats()["index_builds"] == 0
    assert fresh(index_dir).index.stats()["catalog_hits"] == 0
    cache = fresh(index_dir)
    resolve_datasets(spec, cache=cache)
    assert cache.stats()["catalog_hits"] == 1  # rewritten


def test_entry_format_round_trip_and_checks() -> None:
    key = EntryKey("/d/a.jsonl", "size=1 mtime_ns=2", "jsonl.zst")
    starts = np.array([0, 5, 9], dtype=np.int64)
    frames = np.array([[0, 10, 0, 4], [10, 12, 4, 5]], dtype=np.int64)
    data = encode_entry(key, 2, {"starts": starts, "frames": frames})
    entry = decode_entry(memoryview(data), key)
    assert entry.rows == 2
    assert entry.arrays["starts"].tolist() == starts.tolist()
    assert entry.arrays["frames"].tolist() == frames.tolist()
    assert data == encode_entry(key, 2, {"starts": starts, "frames": frames})  # deterministic
    other = EntryKey("/d/a.jsonl", "size=1 mtime_ns=3", "jsonl.zst")
    assert other.name != key.name
    with pytest.raises(CorruptIndexEntry, match="another shard version"):
        decode_entry(memoryview(data), other)
    for bad in (data[:10], data[:-1], b"x" * len(data), data[:20] + b"\x00" + data[21:]):
        with pytest.raises(CorruptIndexEntry):
            decode_entry(memoryview(bad), key)


# ------------------------------------------------------------------ concurrency


# ------------------------------------------------------------------ zstd frames


def test_multi_frame_zstd_rows_are_read_frame_by_frame(tmp_path: Path) -> None:
    rows = [f'{{"i": {i}, "pad": "{"x" * (i % 50)}"}}'.encode() for i in range(3000)]
    content = b"\n".join(rows) + b"\n"
    cctx = zstandard.ZstdCompressor()
    step = 7001  # frames end inside rows: rows cross frame boundaries
    frames = [content[i : i + step] for i in range(0, len(content), step)]
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(b"".join(cctx.compress(f) for f in frames))
    st = path.stat()
    info = ShardInfo(str(path), "jsonl.zst", st.st_size, len(rows), st.st_mtime_ns)
    assert fresh(tmp_path / "index").num_rows(str(path), "jsonl.zst") == len(rows)
    warm = fresh(tmp_path / "index")
    assert warm.num_rows(str(path), "jsonl.zst") == len(rows)
    assert warm.read_rows(info, [0], "t") == [rows[0]]
    assert warm.stats()["decompressions"] == 0 and warm.stats()["frame_reads"] == 1
    order = list(range(len(rows)))
    random.Random(2).shuffle(order)
    assert warm.read_rows(info, order, "t") == [rows[i] for i in order]
    assert warm.stats()["frame_reads"] == len(frames) and warm.stats()["decompressions"] == 0
    got = warm.read_rows(info, [5, 2999], "t", max_document_bytes=10)
    assert [type(v).__name__ for v in got] == ["Oversized", "Oversized"]
    # A frame that no longer decodes to what was indexed is refused, not misread.
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(IncompleteShardError, match=f"cannot decompress shard {path}"):
        fresh(tmp_path / "index").read_rows(info, order, "t")


def test_a_single_frame_zstd_and_gzip_shard_are_read_whole(tmp_path: Path) -> None:
    for name, data in (
        ("one.jsonl.zst", zstandard.ZstdCompressor().compress(b"a\nb\n")),
        ("one.jsonl.gz", gzip.compress(b"a\nb\n")),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        st = path.stat()
        fmt = name.split(".", 1)[1]
        fresh(tmp_path / "index").num_rows(str(path), fmt)
        warm = fresh(tmp_path / "index")
        info = ShardInfo(str(path), fmt, st.st_size, 2, st.st_mtime_ns)
        assert warm.read_rows(info, [1, 0], "t") == [b"b", b"a"]
        assert warm.stats()["decompressions"] == 1 and warm.stats()["frame_reads"] == 0


# ------------------------------------------------------------------ bounds and store


def test_open_line_indexes_are_bounded(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "data", "jsonl", shards=6)
    (info,) = resolve_datasets([DatasetSpec("web", str(root), 1.0)], cache=fresh(tmp_path / "i"))
    cache = fresh(tmp_path / "i", max_open_indexes=2)
    for _ in range(2):
        for n, shard in enumerate(info.shards):
            assert cache.read_rows(shard, [1], "t") == [ROWS[15 * n + 1].encode()]
            assert cache.stats()["line_indexes"] <= 2
    assert cache.stats()["index_builds"] == 0 and cache.stats()["index_reads"] == 12
    with pytest.raises(ValueError, match="max_open_indexes"):
        ShardCache(max_open_indexes=-1)


def test_an_unwritable_index_dir_warns_and_keeps_new_entries_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = write_shards(tmp_path / "data", "jsonl")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    caplog.set_level(logging.WARNING)
    store = open_index_dir(str(blocker / "index"))
    assert store is not None and not store.persistent
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"index directory {blocker / 'index'} is not writable (")
    assert "live in memory only" in warning and "--index-dir" in warning
    assert open_index_dir(str(blocker / "index")) is store  # one per process: warned once
    cache = ShardCache(index=ShardIndex(store))
    (info,) = resolve_datasets([DatasetSpec("web", str(root), 1.0)], cache=cache)
    assert info.num_rows == 90 and cache.stats()["index_writes"] == 3
    assert cache.read_rows(info.shards[0], [0], "t") == [ROWS[0].encode()]
    assert len(caplog.records) == 1


def test_a_read_only_index_is_still_read(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "data", "jsonl")
    spec = [DatasetSpec("web", str(root), 1.0)]
    resolve_datasets(spec, cache=fresh(tmp_path / "index"))
    store = IndexDir(str(tmp_path / "index"), writable=False)
    cache = ShardCache(index=ShardIndex(store))
    resolve_datasets(spec, cache=cache)
    assert cache.stats()["catalog_hits"] == 1 and cache.stats()["index_builds"] == 0
    clone = pickle.loads(pickle.dumps(cache))
    assert clone.index.store.root == store.root and not clone.index.store.writable


def test_index_dir_defaults_and_validation() -> None:
    assert user_index_dir({"XDG_CACHE_HOME": "/x"}) == "/x/zephon/index"
    assert user_index_dir({"HOME": "/home/u"}) == "/home/u/.cache/zephon/index"
    # a relative XDG_CACHE_HOME is ignored (the XDG rule); an empty HOME is the account's
    assert user_index_dir({"XDG_CACHE_HOME": "rel", "HOME": "/h"}) == "/h/.cache/zephon/index"
    import pwd

    home = pwd.getpwuid(os.getuid()).pw_dir
    assert user_index_dir({"HOME": ""}) == os.path.join(home, ".cache", "zephon", "index")
    assert open_index_dir(None) is None and open_index_dir("none") is None
    with pytest.raises(ConfigError, match="index_dir: must be a directory path or 'none'"):
        ExecutionConfig(index_dir="")
    with pytest.raises(ConfigError, match="index_dir is a top-level key"):
        ExecutionConfig.from_mapping({"index_dir": "/tmp/x"})
    from zephon_server.engine.config import parse_config

    base = {
        "datasets": [{"name": "a", "path": "d", "weight": 1}],
        "pipeline": ["tokenize", "batch"],
    }
    assert parse_config(base, base_dir="/cfg")[1].index_dir is None
    assert parse_config({**base, "index_dir": "idx"}, base_dir="/cfg")[1].index_dir == "/cfg/idx"
    assert parse_config({**base, "index_dir": "none"}, base_dir="/cfg")[1].index_dir == "none"
    with pytest.raises(
        ConfigError, match=r"^index_dir: must be a directory path or 'none' .*got 5"
    ):
        parse_config({**base, "index_dir": 5})


# ------------------------------------------------------------------ memory


# ------------------------------------------------------------------ progress bar


def test_progress_bar_lines_on_a_terminal_and_in_a_log() -> None:
    import io

    from zephon_server.progress import ProgressBar, human_bytes, human_seconds

    assert [human_bytes(n) for n in (999, 1234, 5_600_000, 2.5e9)] == [
        "999 B",
        "1.2 kB",
        "5.6 MB",
        "2.5 GB",
    ]
    assert [human_seconds(s) for s in (5, 103, 7300)] == ["5s", "1m43s", "2h01m"]
    for tty in (True, False):
        out = io.StringIO()
        bar = ProgressBar("index", "shards", 3, 3_000_000, out, tty=tty, interval=0).start()
        bar.advance(1_000_000, worked=False)  # found indexed: done, not in the rate
        bar.advance(1_000_000, worked=True)
        assert bar.line().startswith("index: 2/3 shards, 2.0/3.0 MB, ")
        bar.advance(1_000_000, worked=True)
        bar.close()
        text = out.getvalue()
        if tty:  # one line rewritten in place, ended once
            assert text.startswith("\rindex: 0/3 shards, 0.0/3.0 MB, 0 B/s, ETA ?\x1b[K")
            assert text.count("\n") == 1 and text.endswith("ETA 0s\x1b[K\n")
        else:
            lines = text.splitlines()
            assert lines[0] == "index: 0/3 shards, 0.0/3.0 MB, 0 B/s, ETA ?"
            assert lines[-1].startswith("index: 3/3 shards, 3.0/3.0 MB, ") and len(lines) == 2


def test_index_dir_blobs_round_trip_and_old_temporary_files_are_swept(tmp_path: Path) -> None:
    for store in (IndexDir(None), IndexDir(str(tmp_path / "idx"))):
        assert store.get("a/b.zsi") is None and store.open_mapped("a/b.zsi") is None
        store.put_atomic("a/b.zsi", b"payload")
        assert store.get("a/b.zsi") == b"payload"
        mapped = store.open_mapped("a/b.zsi")
        assert mapped is not None and bytes(mapped) == b"payload"
    assert IndexDir(None).where("x") == "<memory>/x" and not IndexDir(None).persistent
    old, new = tmp_path / "idx" / "a" / ".b.zsi.1.x.tmp", tmp_path / "idx" / "a" / ".c.zsi.2.y.tmp"
    for p in (old, new):
        p.write_bytes(b"left by a killed writer")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert IndexDir(str(tmp_path / "idx")).sweep_temporary() == 1
    assert not old.exists() and new.exists() and (tmp_path / "idx" / "a" / "b.zsi").exists()


def test_an_index_dir_removed_under_a_running_process_is_made_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a cache cleaner removing ~/.cache/zephon under a running server must not turn every
    # later entry into a memory-only one (the directories were remembered as made)
    import shutil

    store = IndexDir(str(tmp_path / "idx"))
    store.put_atomic("entries/ab/one.zsi", b"first")
    shutil.rmtree(tmp_path / "idx")
    with caplog.at_level(logging.WARNING):
        store.put_atomic("entries/ab/two.zsi", b"second")
    assert store.persistent and store.stopped is None and not caplog.records
    assert (tmp_path / "idx" / "entries" / "ab" / "two.zsi").read_bytes() == b"second"


def test_operators_in_worker_processes_get_the_plans_index_dir(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "data", "jsonl")
    pipe = Pipeline([DatasetSpec("web", str(root), 1.0)], lanes=2)
    pipe.tokenize(tokenizer="byte").batch(microbatch_size=2)
    plan = pipe.plan(ExecutionConfig(runner="inline", index_dir=str(tmp_path / "idx")))
    ctx = pickle.loads(pickle.dumps(plan.context(plan.ops[0], 0)))  # what a worker receives
    assert ctx.index.root == str(tmp_path / "idx")
    cache = ctx.shard_cache  # in this process: the very cache planning counted with
    assert cache.index.store.root == str(tmp_path / "idx")
    worker = pickle.loads(pickle.dumps(cache))  # in a worker process: a fresh one, same dir
    assert worker.read_rows(plan.datasets[0].shards[0], [0], "t") == [ROWS[0].encode()]
    assert worker.stats()["index_builds"] == 0  # read through the entry planning wrote
    assert worker.stats()["index_reads"] == 1


def test_a_lost_entry_of_a_cached_compressed_shard_is_rebuilt_from_the_content(
    tmp_path: Path,
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.zst", ROWS)
    st = path.stat()
    info = ShardInfo(str(path), "jsonl.zst", st.st_size, len(ROWS), st.st_mtime_ns)
    cache = ShardCache()
    assert cache.read_rows(info, [3], "t") == [ROWS[3].encode()]
    cache._entries.clear()  # the entry is gone (a deleted index) while the content is cached
    cache.index.store.forget_memory()
    cache._counts.clear()
    assert cache.num_rows(str(path), "jsonl.zst", info.identity) == len(ROWS)
    assert cache.stats()["decompressions"] == 1 and cache.stats()["index_writes"] == 2


def test_a_damaged_file_is_logged_once_per_process(tmp_path, caplog) -> None:
    # The listing, a read and a build each meet the same damaged file: one warning, every
    # meeting counted.
    index = ShardIndex(IndexDir(str(tmp_path)))
    with caplog.at_level("WARNING", logger="zephon_server.engine.shard_index"):
        for _ in range(3):
            index.discard("entries/ab/abcd.zsi", "checksum mismatch in index entry")
        index.discard("entries/ab/abcd.zsi", "truncated index entry: 5 bytes")  # another problem
    assert index.corrupt == 4
    assert [r.getMessage().count("abcd.zsi") for r in caplog.records] == [1, 1]


def test_an_index_store_found_unreachable_stays_unused_in_worker_processes() -> None:
    # a worker handed the index dir must not pay a retry budget per entry again
    from zephon_server.engine.index_dir import ObjectIndexDir

    store = ObjectIndexDir("s3://bucket/index")
    store.unreachable = "storage request failed: put ... (network)"
    copy = pickle.loads(pickle.dumps(store))
    assert isinstance(copy, ObjectIndexDir) and copy.unreachable == store.unreachable
    assert copy.get("entries/ab/x.zsi") is None  # answered without a request
