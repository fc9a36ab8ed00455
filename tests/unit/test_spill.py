"""Large compressed shards (issue 20 leftovers): a ``.jsonl.gz`` or single-frame
``.jsonl.zst`` shard whose content is over the spill threshold is stream-decompressed once
into a spill file and read from it like plain JSONL: the same rows and batch digests as the
plain file, memory far below the content's size, at most one decompression per spill file
(also across processes), a bounded spill directory, and clear errors when a shard cannot be
spilled. Integrity checks still fire at start-up.

The tests of the same topic that need a subprocess, worker processes, a socket or a real
file system limit are in ``tests/service/test_spill.py`` and ``tests/reliability/test_spill.py``.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from zephon_server.engine import line_index
from zephon_server.engine import shards as shards_mod
from zephon_server.engine.datasets import DatasetSpec, ShardInfo, resolve_datasets
from zephon_server.engine.decompression import IncompleteShardError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.index_dir import IndexDir
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.shard_index import ShardIndex
from zephon_server.engine.shards import ShardCache
from zephon_server.engine.spill import SpillDir, SpillError

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20


def rows(n: int, seed: int = 0) -> list[bytes]:
    return [
        json.dumps({"text": f"doc {seed}-{i} " + "lorem ipsum dolor " * (5 + i % 120)}).encode()
        for i in range(n)
    ]


def write_formats(root: Path, lines: list[bytes], name: str = "s") -> dict[str, Path]:
    """The same content as plain JSONL, gzip and single-frame zstd (one file per dir)."""
    content = b"\n".join(lines) + b"\n"
    out = {}
    for fmt, data in (
        ("jsonl", content),
        ("jsonl.gz", gzip.compress(content, compresslevel=1, mtime=0)),
        ("jsonl.zst", zstandard.ZstdCompressor(level=1).compress(content)),
    ):
        path = root / fmt.replace(".", "_") / f"{name}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        out[fmt] = path
    return out


def info(path: Path, fmt: str, n: int) -> ShardInfo:
    st = path.stat()
    return ShardInfo(str(path), fmt, st.st_size, n, st.st_mtime_ns)


def cache_on(index_dir: Path, **kw: object) -> ShardCache:
    """A new process's cache on ``index_dir`` (its spill files in ``index_dir/spill``)."""
    return ShardCache(index=ShardIndex(IndexDir(str(index_dir))), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["jsonl.gz", "jsonl.zst"])
def test_a_shard_over_the_threshold_is_read_from_a_spill_with_bounded_memory(
    tmp_path: Path, fmt: str
) -> None:
    lines = rows(30_000)
    paths = write_formats(tmp_path / "data", lines)
    content = paths["jsonl"].stat().st_size
    assert content > 30 * MIB
    index_dir = tmp_path / "index"
    cache = cache_on(index_dir, spill_threshold=MIB)
    shard = info(paths[fmt], fmt, len(lines))
    tracemalloc.start()
    try:
        assert cache.num_rows(shard.path, fmt) == len(lines)
        wrong = 0
        for start in range(0, len(lines), 997):  # every row, a micro-batch at a time
            part = range(start, min(start + 997, len(lines)))
            got = cache.read_rows(shard, part, "t")
            wrong += sum(g != lines[i] for g, i in zip(got, part))
        del got
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert wrong == 0
    # One decoder buffer, the newline scan's reused mask (9/8 of a block, kept for the next
    # scans) and the line starts (8 bytes a row), not the 30+ MB of content.
    scan = line_index._BLOCK * 9 // 8
    assert peak < 4 * MIB + scan + 16 * len(lines), (peak, content)
    stats = cache.stats()
    assert (stats["decompressions"], stats["spills"]) == (1, 1)
    (spilled,) = (index_dir / "spill").glob("*.spill")
    assert spilled.read_bytes() == paths["jsonl"].read_bytes()
    # Another process on the same index directory reuses the spill file: no decompression.
    other = cache_on(index_dir, spill_threshold=MIB)
    assert other.read_rows(shard, [29_999, 0, 17], "t") == [lines[29_999], lines[0], lines[17]]
    assert other.stats()["decompressions"] == 0 and other.stats()["spill_hits"] == 1


def test_gz_and_zst_shards_over_the_threshold_give_the_plain_jsonl_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shards_mod, "DEFAULT_THRESHOLD", 64 * 1024)
    lines = rows(2_000)
    paths = {fmt: p.parent for fmt, p in write_formats(tmp_path / "data", lines).items()}
    for fmt, d in write_formats(tmp_path / "data", rows(1_500, seed=1), name="t").items():
        assert d.parent == paths[fmt]
    digests = {}
    for fmt, directory in paths.items():
        pipe = Pipeline(
            [DatasetSpec("d", str(directory), 1.0)],
            seed=3,
            lanes=2,
            chunk_size=16,
            end_of_data="longest",  # every row read: the count below is the whole corpus
        )
        pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=4)
        index_dir = tmp_path / f"index-{fmt}"
        run = pipe.run(ExecutionConfig(runner="threads", workers=2, index_dir=str(index_dir)))
        digests[fmt] = [(b.lane_id, b.chain_digest.hex()) for b in run.batches()]
        run.close()
        if fmt != "jsonl":
            assert len(list((index_dir / "spill").glob("*.spill"))) == 2  # both shards spilled
    assert digests["jsonl.gz"] == digests["jsonl"] == digests["jsonl.zst"]
    assert len(digests["jsonl"]) >= 3500 // 4 - 2


def test_the_spill_directory_keeps_its_budget_least_recently_used_first(tmp_path: Path) -> None:
    a, b = rows(3000, seed=1), rows(3000, seed=2)
    pa = write_formats(tmp_path / "data", a, "a")["jsonl.gz"]
    pb = write_formats(tmp_path / "data", b, "b")["jsonl.gz"]
    size = (tmp_path / "data" / "jsonl" / "a.jsonl").stat().st_size
    spill = SpillDir(str(tmp_path / "spill"), max_bytes=int(1.5 * size))
    cache = ShardCache(max_bytes=0, spill=spill)  # nothing kept in memory
    sa, sb = info(pa, "jsonl.gz", len(a)), info(pb, "jsonl.gz", len(b))
    assert cache.read_rows(sa, [5], "t") == [a[5]]
    assert cache.read_rows(sb, [7], "t") == [b[7]]  # a's file makes room for b's
    assert len(list((tmp_path / "spill").glob("*.spill"))) == 1
    assert spill.usage() <= spill.budget()
    assert cache.read_rows(sa, [9, 2999], "t") == [a[9], a[2999]]  # spilled again
    assert cache.stats()["spills"] == 3 and spill.usage() <= spill.budget()


def test_a_spill_file_removed_under_a_reader_is_spilled_again(tmp_path: Path) -> None:
    lines = rows(2000)
    path = write_formats(tmp_path / "data", lines)["jsonl.zst"]
    cache = cache_on(tmp_path / "index", spill_threshold=1024)
    shard = info(path, "jsonl.zst", len(lines))
    assert cache.read_rows(shard, [3], "t") == [lines[3]]
    for f in (tmp_path / "index" / "spill").glob("*.spill"):
        f.unlink()  # another process made room
    assert cache.read_rows(shard, [1999, 4], "t") == [lines[1999], lines[4]]
    assert cache.stats()["spills"] == 2


def test_a_spill_file_damaged_on_disk_is_removed_and_spilled_again(tmp_path: Path, caplog) -> None:
    """A spill file is the cache's copy, not data: damaged in place (its size and time kept,
    as a crash before its pages were written leaves it), it is made again, never an error
    that no fix of the shard could clear."""
    lines = rows(2000)
    path = write_formats(tmp_path / "data", lines)["jsonl.zst"]
    cache = cache_on(tmp_path / "index", spill_threshold=1024)
    shard = info(path, "jsonl.zst", len(lines))
    assert cache.read_rows(shard, [3], "t") == [lines[3]]
    (spilled,) = (tmp_path / "index" / "spill").glob("*.spill")
    stat = spilled.stat()
    with open(spilled, "r+b") as fh:
        fh.write(b"\0" * (stat.st_size // 2))
    os.utime(spilled, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with caplog.at_level("WARNING"):
        assert cache.read_rows(shard, [1, 1999], "t") == [lines[1], lines[1999]]
    assert any("is damaged" in r.getMessage() for r in caplog.records)
    assert cache.stats()["spills"] == 2


def test_a_shard_larger_than_the_spill_budget_is_counted_and_refused_when_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = rows(3000)
    paths = write_formats(tmp_path / "data", lines)
    spill = SpillDir(str(tmp_path / "spill"), max_bytes=256 * 1024)
    cache = ShardCache(spill=spill, spill_threshold=64 * 1024)
    shard = info(paths["jsonl.gz"], "jsonl.gz", len(lines))
    caplog.set_level(logging.WARNING)
    assert cache.num_rows(shard.path, "jsonl.gz") == len(lines)  # counting needs no spill
    warned = [r.getMessage() for r in caplog.records]
    assert any("more than the spill budget of 262144 bytes" in w for w in warned)
    with pytest.raises(SpillError) as err:
        cache.read_rows(shard, [0], "t")
    text = str(err.value)
    assert str(paths["jsonl.gz"]) in text and "raise --spill-max-bytes" in text
    assert "zstd -B16M" in text and "split it" in text
    assert not list((tmp_path / "spill").glob("*"))[1:]  # at most the lock file, no spill
    # A multi-frame zstd shard as large needs no spill: it is read frame by frame.
    content = paths["jsonl"].read_bytes()
    cctx = zstandard.ZstdCompressor(level=1)
    framed = tmp_path / "framed.jsonl.zst"
    step = 50_000
    framed.write_bytes(
        b"".join(cctx.compress(content[i : i + step]) for i in range(0, len(content), step))
    )
    fshard = info(framed, "jsonl.zst", len(lines))
    caplog.clear()
    assert cache.num_rows(fshard.path, "jsonl.zst") == len(lines)
    assert not caplog.records  # nothing to warn about: it needs no spill
    assert cache.read_rows(fshard, [2999, 1], "t") == [lines[2999], lines[1]]
    assert cache.stats()["frame_reads"] > 0


def test_a_multi_frame_zstd_shard_is_not_spilled_it_is_read_frame_by_frame(
    tmp_path: Path,
) -> None:
    lines = rows(3000)
    content = b"\n".join(lines) + b"\n"
    cctx = zstandard.ZstdCompressor(level=1)
    path = tmp_path / "framed.jsonl.zst"
    path.write_bytes(
        b"".join(cctx.compress(content[i : i + 40_000]) for i in range(0, len(content), 40_000))
    )
    cache = cache_on(tmp_path / "index", spill_threshold=64 * 1024)
    shard = info(path, "jsonl.zst", len(lines))
    assert cache.num_rows(shard.path, "jsonl.zst") == len(lines)
    assert cache.read_rows(shard, [0, 2999, 1500], "t") == [lines[0], lines[2999], lines[1500]]
    assert cache.stats()["spills"] == 0 and cache.stats()["frame_reads"] >= 3
    assert not list((tmp_path / "index").glob("spill/*.spill"))
    assert not list((tmp_path / "index").glob("spill/*.tmp"))


@pytest.mark.parametrize("fmt", ["jsonl.gz", "jsonl.zst"])
def test_a_truncated_large_shard_still_fails_at_start_up_and_leaves_no_spill(
    tmp_path: Path, fmt: str
) -> None:
    lines = rows(3000)
    path = write_formats(tmp_path / "data", lines)[fmt]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    cache = cache_on(tmp_path / "index", spill_threshold=1024)
    with pytest.raises(IncompleteShardError, match=f"cannot decompress shard {path}"):
        resolve_datasets([DatasetSpec("d", str(path), 1.0)], cache=cache)
    assert not list((tmp_path / "index" / "spill").glob("*.spill"))
    assert not list((tmp_path / "index" / "spill").glob("*.tmp"))


def test_building_the_index_ahead_of_time_writes_no_spill_file(tmp_path: Path) -> None:
    lines = rows(3000)
    path = write_formats(tmp_path / "data", lines)["jsonl.gz"]
    st = path.stat()
    from zephon_server.engine.identity import local_identity

    cache = cache_on(tmp_path / "index", spill_threshold=1024)
    identity = local_identity(st.st_size, st.st_mtime_ns)
    assert cache.ensure_entry(str(path), "jsonl.gz", identity) == (len(lines), None, True)
    assert not list((tmp_path / "index").glob("spill/*.spill"))  # counting only
    reader = cache_on(tmp_path / "index", spill_threshold=1024)  # a server afterwards
    assert reader.read_rows(info(path, "jsonl.gz", len(lines)), [2999], "t") == [lines[2999]]
    assert reader.stats()["spills"] == 1


def test_an_index_directory_under_the_dataset_never_adds_its_spill_files_as_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The index directory in the data (a state directory kept beside the shards): its spill
    # files hold plain JSONL bytes, which a ".jsonl" name made shards of the dataset at the
    # next start (every row of the spilled shard served twice, without a word).
    monkeypatch.setattr(shards_mod, "DEFAULT_THRESHOLD", 64 * 1024)
    directory = write_formats(tmp_path / "data", rows(2_000))["jsonl.gz"].parent
    for plain in directory.glob("*.spill"):
        plain.unlink()  # the gz shard alone
    index_dir = directory / "state" / "index"
    legacy = index_dir / "spill" / ("0" * 40 + ".jsonl")  # left by an earlier version
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b'{"text": "stale"}\n')

    def start() -> tuple[int, list[str]]:
        pipe = Pipeline([DatasetSpec("d", str(directory), 1.0)], seed=3, lanes=2, chunk_size=16)
        pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=4)
        run = pipe.run(ExecutionConfig(runner="inline", index_dir=str(index_dir)))
        digests = [b.chain_digest.hex() for b in run.batches()]
        shards = sum(len(d.shards) for d in run.plan.datasets)
        run.close()
        return shards, digests

    first = start()
    assert not legacy.exists()  # removed when the directory was opened, before any listing
    assert list((index_dir / "spill").glob("*.spill"))  # spilled
    assert start() == first and first[0] == 1  # the same shard and batches on a restart
