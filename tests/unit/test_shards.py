"""Shard reading: random access by row equals a naive read, indexes are built once, the LRU
budget holds, and unreadable data raises DataError naming the file."""

from __future__ import annotations

import gzip
import pickle
import random
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from zephon_server.engine import line_index as line_index_mod
from zephon_server.engine import parquet_footers
from zephon_server.engine import shards as shards_mod
from zephon_server.engine.corpus import write_jsonl, write_parquet
from zephon_server.engine.datasets import ShardInfo
from zephon_server.engine.errors import DataError, ShardChanged
from zephon_server.engine.shards import ShardCache, index_lines, infer_format, line_starts

pytestmark = pytest.mark.timeout(60)

# Blank lines and non-ASCII text are rows like any other.
ROWS: list[str] = [
    '{"text": "hello"}',
    "",
    '{"text": "café naïve 日本"}',
    '{"text": "x"}',
    "",
    "",
    '{"text": "' + "long " * 500 + '"}',
    "not json at all",
] + [f'{{"text": "row {i}"}}' for i in range(200)]


def naive_lines(data: bytes) -> list[bytes]:
    """Every newline-terminated line plus a final unterminated non-empty line."""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return parts


def shard(path: Path, fmt: str) -> ShardInfo:
    st = path.stat()
    return ShardInfo(str(path), fmt, st.st_size, -1, st.st_mtime_ns)


def write_fmt(tmp_path: Path, fmt: str, rows: list[str]) -> Path:
    path = tmp_path / f"data.{fmt}"
    write_jsonl(path, rows)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst"])
def test_jsonl_rows_in_any_order_equal_naive_read(tmp_path: Path, fmt: str) -> None:
    path = write_fmt(tmp_path, fmt, ROWS)
    raw = path.read_bytes()
    if fmt == "jsonl.gz":
        raw = gzip.decompress(raw)
    elif fmt == "jsonl.zst":
        raw = zstandard.ZstdDecompressor().decompress(raw)
    expected = naive_lines(raw)
    cache = ShardCache()
    assert cache.num_rows(str(path), fmt) == len(expected) == len(ROWS)
    order = list(range(len(expected)))
    random.Random(7).shuffle(order)
    order += [3, 3, 0, len(expected) - 1]  # duplicates are allowed
    got = cache.read_rows(shard(path, fmt), order, "ignored")
    assert got == [expected[i] for i in order]
    assert all(isinstance(v, bytes) for v in got)
    assert cache.read_rows(shard(path, fmt), [], "text") == []


@pytest.mark.parametrize(
    "data",
    [b"", b"\n", b"a", b"a\n", b"a\nb", b"\n\n", b"a\n\nb\n", b"x\r\ny\r\n", b"\n\nlast"],
)
@pytest.mark.parametrize("block", [1, 2, 3, 1 << 24])
def test_line_index_edge_cases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, block: int
) -> None:
    # Tiny blocks make newlines fall on block boundaries.
    monkeypatch.setattr(line_index_mod, "_BLOCK", block)
    path = tmp_path / "edge.jsonl"
    path.write_bytes(data)
    expected = naive_lines(data)
    for starts in (index_lines(str(path)), line_starts(data)):
        assert len(starts) - 1 == len(expected)
        got = [data[a : b - 1] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
        assert got == expected
    cache = ShardCache()
    assert cache.read_rows(shard(path, "jsonl"), list(range(len(expected))), "t") == expected


def test_plain_jsonl_is_indexed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_fmt(tmp_path, "jsonl", ROWS)
    calls = []
    real = shards_mod.index_lines

    def counting(p: str):  # type: ignore[no-untyped-def]
        calls.append(p)
        return real(p)

    monkeypatch.setattr(shards_mod, "index_lines", counting)
    cache = ShardCache()
    info = shard(path, "jsonl")
    assert cache.num_rows(str(path), "jsonl") == len(ROWS)
    for start in range(0, len(ROWS), 16):
        cache.read_rows(info, list(range(start, min(start + 16, len(ROWS)))), "text")
    assert cache.num_rows(str(path), "jsonl") == len(ROWS)
    assert calls == [str(path)]
    assert cache.index_builds == 1


def test_compressed_shard_decompressed_once(tmp_path: Path) -> None:
    path = write_fmt(tmp_path, "jsonl.zst", ROWS)
    cache = ShardCache()
    cache.num_rows(str(path), "jsonl.zst")
    for i in range(10):
        cache.read_rows(shard(path, "jsonl.zst"), [i, 2 * i], "text")
    assert cache.decompressions == 1
    assert cache.hits >= 10


def test_multi_frame_zstd_and_multi_member_gzip(tmp_path: Path) -> None:
    a = b"".join(f'{{"i": {i}}}\n'.encode() for i in range(5))
    b = b"".join(f'{{"i": {i}}}\n'.encode() for i in range(5, 9))
    zst = tmp_path / "multi.jsonl.zst"
    cctx = zstandard.ZstdCompressor()
    zst.write_bytes(cctx.compress(a) + cctx.compress(b))
    gz = tmp_path / "multi.jsonl.gz"
    gz.write_bytes(gzip.compress(a) + gzip.compress(b))
    cache = ShardCache()
    for path, fmt in ((zst, "jsonl.zst"), (gz, "jsonl.gz")):
        assert cache.num_rows(str(path), fmt) == 9
        assert cache.read_rows(shard(path, fmt), [8, 0], "t") == [b'{"i": 8}', b'{"i": 0}']
    # Many frames after a small first one (as streaming writers make them): all of it, too.
    big = b"".join(f'{{"i": {i}, "pad": "{"x" * (i % 97)}"}}\n'.encode() for i in range(20_000))
    frames = tmp_path / "frames.jsonl.zst"
    frames.write_bytes(b"".join(cctx.compress(big[i : i + 5000]) for i in range(0, len(big), 5000)))
    assert bytes(shards_mod._decompress(str(frames), "jsonl.zst")) == big
    members = tmp_path / "members.jsonl.gz"
    members.write_bytes(gzip.compress(big[:100]) + gzip.compress(big[100:]))
    assert bytes(shards_mod._decompress(str(members), "jsonl.gz")) == big


@pytest.mark.parametrize("fmt", ["jsonl.zst", "jsonl.gz"])
def test_a_compressed_shard_is_never_held_twice_while_decompressed(tmp_path: Path, fmt) -> None:
    """Decompression fills one buffer sized from the header (zstd content size, gzip ISIZE):
    the peak of Python allocations stays near one copy of the content, not two."""
    import tracemalloc

    rows = [f'{{"text": "row {i} {"lorem ipsum " * (i % 40)}"}}' for i in range(60_000)]
    content = ("\n".join(rows) + "\n").encode()
    path = tmp_path / f"big.{fmt}"
    if fmt == "jsonl.zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(content))
    else:
        path.write_bytes(gzip.compress(content))
    assert len(content) > 10_000_000
    tracemalloc.start()
    try:
        data = shards_mod._decompress(str(path), fmt)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert data == content
    assert peak < 1.3 * len(content), (peak, len(content))
    cache = ShardCache()
    got = cache.read_rows(shard(path, fmt), [59_999, 0], "text")
    assert got == [rows[59_999].encode(), rows[0].encode()]
    assert all(type(row) is bytes for row in got)


def test_lru_respects_byte_budget(tmp_path: Path) -> None:
    paths = []
    for i in range(4):
        rows = [f'{{"text": "shard {i} row {r} {"x" * 50}"}}' for r in range(100)]
        paths.append(write_jsonl(tmp_path / f"s{i}.jsonl.gz", rows))
    one = len(gzip.decompress(paths[0].read_bytes())) + 8 * 101
    cache = ShardCache(max_bytes=2 * one + 10)
    for p in paths:
        cache.read_rows(shard(p, "jsonl.gz"), [0], "text")
        assert cache.bytes_cached <= cache.max_bytes
    assert cache.decompressions == 4
    assert cache.evictions == 2
    # The two most recent shards are cached; the first one was evicted and is read again.
    cache.read_rows(shard(paths[3], "jsonl.gz"), [1], "text")
    assert cache.decompressions == 4
    assert cache.read_rows(shard(paths[0], "jsonl.gz"), [5], "text")[0].startswith(
        b'{"text": "shard 0 row 5'
    )
    assert cache.decompressions == 5
    assert cache.bytes_cached <= cache.max_bytes
    # Row counts survive eviction: counting never decompresses again.
    for p in paths:
        assert cache.num_rows(str(p), "jsonl.gz") == 100
    assert cache.decompressions == 5


def test_entry_larger_than_budget_is_read_but_not_cached(tmp_path: Path) -> None:
    path = write_fmt(tmp_path, "jsonl.zst", ROWS)
    cache = ShardCache(max_bytes=100)
    assert cache.read_rows(shard(path, "jsonl.zst"), [0], "t") == [ROWS[0].encode()]
    assert cache.bytes_cached == 0
    assert cache.stats()["entries"] == 0


def test_parquet_reads_only_needed_row_groups(tmp_path: Path) -> None:
    texts = [f"doc {i} café" if i % 7 else None for i in range(100)]
    path = write_parquet(
        tmp_path / "p.parquet", {"id": list(range(100)), "content": texts}, row_group_size=10
    )
    assert pq.ParquetFile(path).metadata.num_row_groups == 10
    cache = ShardCache()
    assert cache.num_rows(str(path), "parquet") == 100
    assert cache.row_group_reads == 0
    info = shard(path, "parquet")
    assert cache.read_rows(info, [3, 1, 3], "content") == [texts[3], texts[1], texts[3]]
    assert cache.row_group_reads == 1
    order = list(range(100))
    random.Random(3).shuffle(order)
    assert cache.read_rows(info, order, "content") == [texts[i] for i in order]
    assert cache.row_group_reads == 10
    assert cache.read_rows(info, [0, 7], "content") == [None, None]  # nulls
    assert cache.row_group_reads == 10  # served from the LRU


@pytest.mark.parametrize("budget", [1, None])
def test_parquet_footers_kept_are_bounded(tmp_path: Path, monkeypatch, budget) -> None:
    # One footer per shard a process ever read, never dropped, was memory growing with the
    # number of Parquet shards (wide tables have footers of megabytes once parsed).
    if budget is not None:
        monkeypatch.setattr(parquet_footers, "FOOTER_BUDGET", budget)
    infos = [
        shard(write_parquet(tmp_path / f"p{i}.parquet", {"t": [f"doc {i}"]}), "parquet")
        for i in range(4)
    ]
    cache = ShardCache()
    for info in [*infos, infos[3], infos[0]]:
        assert cache.read_rows(info, [0], "t") == [f"doc {infos.index(info)}"]
    # Over the budget only the newest is kept: shard 3 read again from it, shard 0 re-read.
    assert cache.footer_reads == (5 if budget == 1 else 4)


def test_the_footer_lru_keeps_within_its_budget_newest_first() -> None:
    footers = parquet_footers.FooterCache(budget=3 * 16 * 100)  # three footers of 100 bytes
    for name in "abcd":
        footers.put(name, "v1", name.upper(), 100)
    assert [footers.get(n, "v1") for n in "abcd"] == [None, "B", "C", "D"]
    assert footers.get("b", "v2") is None  # another version of the shard: not its footer
    footers.get("b", "v1")  # b is now the most recently used: c goes first
    footers.put("e", "v1", "E", 100)
    assert [footers.get(n, "v1") for n in "bcde"] == ["B", None, "D", "E"]
    footers.put("huge", "v1", "H", 10**9)  # over the budget alone: kept, every other dropped
    assert footers.get("huge", "v1") == "H" and footers.get("e", "v1") is None


def test_parquet_missing_column_names_file_and_columns(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet", [{"id": 1, "body": "x"}])
    with pytest.raises(DataError) as err:
        ShardCache().read_rows(shard(path, "parquet"), [0], "text")
    msg = str(err.value)
    assert str(path) in msg and "'text'" in msg and "body" in msg and "id" in msg


def test_parquet_non_text_column_is_a_data_error(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet", [{"id": 1, "body": "x"}])
    with pytest.raises(DataError, match="'id' has type int64"):
        ShardCache().read_rows(shard(path, "parquet"), [0], "id")


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst", "parquet"])
def test_missing_file_raises_data_error(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"nope.{fmt}"
    cache = ShardCache()
    with pytest.raises(DataError, match=str(path)):
        cache.num_rows(str(path), fmt)
    with pytest.raises(DataError, match=str(path)):
        cache.read_rows(ShardInfo(str(path), fmt, 0, 1, 0), [0], "text")


def test_vanished_file_after_indexing(tmp_path: Path) -> None:
    path = write_fmt(tmp_path, "jsonl", ROWS)
    cache = ShardCache()
    indexed = shard(path, "jsonl")
    cache.num_rows(str(path), "jsonl")
    path.unlink()
    with pytest.raises(DataError, match=f"{path}.*No such file"):
        cache.read_rows(indexed, [1], "t")


def test_truncated_file_after_indexing(tmp_path: Path) -> None:
    """A shorter file is caught by the identity check before any pread (the pread's own
    "shorter than when it was indexed" check is left for a truncation racing the fstat)."""
    path = write_fmt(tmp_path, "jsonl", ROWS)
    cache = ShardCache()
    indexed = shard(path, "jsonl")
    cache.num_rows(str(path), "jsonl")
    path.write_bytes(b"short\n")
    with pytest.raises(ShardChanged, match=rf"shard {path} changed after .*size \d+ -> 6 bytes"):
        cache.read_rows(indexed, [len(ROWS) - 1], "t")


@pytest.mark.parametrize("fmt", ["jsonl.gz", "jsonl.zst"])
def test_corrupt_compressed_file(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"bad.{fmt}"
    path.write_bytes(b"this is not compressed data at all")
    with pytest.raises(DataError, match=f"cannot decompress shard {path}"):
        ShardCache().num_rows(str(path), fmt)


def test_row_out_of_range(tmp_path: Path) -> None:
    path = write_fmt(tmp_path, "jsonl", ROWS[:3])
    with pytest.raises(DataError, match="row 3 out of range"):
        ShardCache().read_rows(shard(path, "jsonl"), [0, 3], "t")
    with pytest.raises(DataError, match="row -1 out of range"):
        ShardCache().read_rows(shard(path, "jsonl"), [-1], "t")


def test_concurrent_reads_build_one_index(tmp_path: Path) -> None:
    paths = [write_jsonl(tmp_path / f"c{i}.jsonl", ROWS) for i in range(3)]
    cache = ShardCache()
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        try:
            barrier.wait()
            rnd = random.Random(seed)
            for _ in range(30):
                p = rnd.choice(paths)
                rows = [rnd.randrange(len(ROWS)) for _ in range(8)]
                got = cache.read_rows(shard(p, "jsonl"), rows, "t")
                assert got == [ROWS[r].encode() for r in rows]
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.index_builds == 3


def test_pickled_cache_is_empty_with_same_budget(tmp_path: Path) -> None:
    path = write_fmt(tmp_path, "jsonl", ROWS)
    cache = ShardCache(max_bytes=12345)
    cache.num_rows(str(path), "jsonl")
    clone = pickle.loads(pickle.dumps(cache))
    assert clone.max_bytes == 12345
    assert clone.stats()["line_indexes"] == 0
    assert clone.read_rows(shard(path, "jsonl"), [0], "t") == [ROWS[0].encode()]


def test_infer_format() -> None:
    assert infer_format("/a/b.jsonl") == "jsonl"
    assert infer_format("/a/b.JSONL.GZ") == "jsonl.gz"
    assert infer_format("b.jsonl.zst") == "jsonl.zst"
    assert infer_format("b.parquet") == "parquet"
    assert infer_format("b.json") is None
    assert infer_format("b.gz") is None
