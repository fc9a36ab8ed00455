"""Reading Parquet shards: damaged pages are refused where the file can tell (page checksums,
compression) and cost only their own row group's rows, whatever the runner and across a
resume; a value over ``max_document_bytes`` is never made into a Python object nor cached;
a dictionary-encoded text column reads exactly as the plain column does.
"""

from __future__ import annotations

import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.test_bad_records import collect
from zephon_server.engine import shards
from zephon_server.engine.datasets import DatasetSpec, ShardInfo
from zephon_server.engine.errors import DataError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.parquet_columns import check_field, value_sizes
from zephon_server.engine.parquet_rows import DamagedRowGroup, Unreadable, read_column
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.shards import Oversized, ShardCache
from zephon_server.engine.storage.shard_io import ObjectFile
from zephon_server.engine.storage.store import LocalStore

pytestmark = pytest.mark.timeout(60)

RUNNERS = ["inline", "threads"]
EOS = 257  # the byte tokenizer's
TEXTS = [f"document {i:03d} " + "abcdefghij" * 5 for i in range(200)]
BAD_GROUP = range(60, 80)  # row group 3 of 20-row groups


def write(path: Path, column: Any, row_group_size: int, **options: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": column}), path, row_group_size=row_group_size, **options)
    return path


def shard(path: Path) -> ShardInfo:
    st = path.stat()
    return ShardInfo(str(path), "parquet", st.st_size, -1, st.st_mtime_ns)


def flip(path: Path, needle: bytes) -> None:
    """Change one digit of the text ``needle`` where the file stores it."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at > 0
    data[at + len(needle) - 3] ^= 0x01  # "document 013" -> "document 113"
    path.write_bytes(bytes(data))


def damaged_shard(tmp_path: Path) -> Path:
    """200 rows in snappy row groups of 20; the middle of row group 3's data overwritten."""
    path = write(tmp_path / "ds" / "part.parquet", TEXTS, 20, use_dictionary=False)
    chunk = pq.ParquetFile(path).metadata.row_group(3).column(0)
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle : middle + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    return path


def pipeline(path: Path, on_error: str) -> Pipeline:
    spec = DatasetSpec("ds", str(path), 1.0, on_error=on_error)
    pipe = Pipeline(
        [spec], seed=3, lanes=2, chunk_size=8, flush_every_k_chunks=2, end_of_data="longest"
    )
    return pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=3, drop_last=False)


# ------------------------------------------------------------------------ page checksums


def checksummed(path: Path, texts: list[str]) -> Path:
    """``texts`` in row groups of 20, uncompressed, plain-encoded, with page checksums."""
    kw = {"compression": "none", "use_dictionary": False, "write_page_checksum": True}
    return write(path, texts, 20, **kw)


def test_a_page_failing_its_checksum_is_unreadable_not_changed_text(tmp_path, monkeypatch):
    # Uncompressed and plain-encoded: only the page checksum can tell the changed digit.
    path = checksummed(tmp_path / "part.parquet", TEXTS[:40])
    flip(path, b"document 013")
    cache = ShardCache()
    got = cache.read_rows(shard(path), list(range(40)), "text")
    assert got[20:] == TEXTS[20:40]
    decoded = []
    monkeypatch.setattr(shards, "read_column", lambda *a: decoded.append(a[2]) or read_column(*a))
    assert cache.read_rows(shard(path), [3, 25], "text") == [got[3], TEXTS[25]]
    assert decoded == []  # the damaged row group's marker is kept: not decoded again
    marker = got[0]
    assert isinstance(marker, Unreadable) and got[:20] == [marker] * 20
    assert (marker.path, marker.row_group, marker.first, marker.end) == (str(path), 0, 0, 20)
    assert "CRC checksum verification failed" in marker.problem
    assert marker.message() == (
        f"cannot read row group 0 (rows 0-19) of Parquet shard {path} ({marker.problem}): the "
        "file is damaged; re-create or re-download the shard, or remove it from the dataset"
    )


def test_an_object_store_read_checks_page_checksums_too(tmp_path):
    path = checksummed(tmp_path / "part.parquet", TEXTS[:20])
    flip(path, b"document 013")
    source = ObjectFile(LocalStore(), str(path), path.stat().st_size)
    md = pq.ParquetFile(path).metadata
    with pytest.raises(DamagedRowGroup, match="CRC checksum verification failed"):
        read_column(source, md, 0, "text", "s3://b/part.parquet", np.array([0, 20]))


# ------------------------------------------------------------- a damaged row group, skipped


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_damaged_row_group_costs_only_its_own_rows_under_skip(tmp_path, runner, caplog):
    path = damaged_shard(tmp_path)
    with caplog.at_level("WARNING", logger="zephon_server.engine.ops.fetch"):
        docs, tombstones, stats = collect(pipeline(path, "skip"), runner)
    assert docs == {i: t.encode() for i, t in enumerate(TEXTS) if i not in BAD_GROUP}
    assert tombstones == Counter((i, "read_error") for i in BAD_GROUP)
    assert stats["skipped"] == {"ds": 20} and stats["tombstones"] == {"read_error": 20}
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(
        line.startswith(
            "skipping the rows of a damaged Parquet row group (the shard's other "
            "row groups are served;"
        )
        and f"cannot read row group 3 (rows 60-79) of Parquet shard {path} (" in line
        for line in lines
    ), lines


def test_resume_over_a_damaged_row_group_equals_the_uninterrupted_run(tmp_path):
    pipe = pipeline(damaged_shard(tmp_path), "skip")
    run = pipe.run(ExecutionConfig(runner="inline"))
    lane0 = [b for b in run if isinstance(b, NumberedBatch) and b.lane_id == 0]

    def seen(batch: NumberedBatch) -> tuple[bytes, list[tuple[int, str]]]:
        return batch.chain_digest, [(m.doc.row, m.tombstone) for m in batch.tombstones]

    assert any(m.doc.row in BAD_GROUP for b in lane0 for m in b.tombstones)
    for cut in range(1, len(lane0)):  # every step
        resumed = pipe.run(
            ExecutionConfig(runner="threads", workers=2), resume=run.checkpoint({0: cut})
        )
        assert [seen(b) for b in resumed.batches()] == [seen(b) for b in lane0[cut:]], cut


def test_a_damaged_row_group_fails_naming_file_row_group_rows_and_fix(tmp_path):
    path = damaged_shard(tmp_path)
    with pytest.raises(DataError) as info:
        collect(pipeline(path, "fail"), "inline")
    message = str(info.value)
    assert message.startswith(f"dataset 'ds': {path}:row ")
    row = int(message.split(":row ")[1].split(":")[0])
    assert row in BAD_GROUP
    assert "its row group 3 (rows 60-79) cannot be read (" in message
    assert message.endswith(
        "): the file is damaged; re-create or re-download the shard, or remove it from the "
        "dataset or set on_error: skip on dataset 'ds' to skip and count such records"
    )


def test_a_shard_nested_deeper_than_pyarrow_reads_names_the_nesting(tmp_path):
    from zephon_server.engine.parquet_rows import read_footer

    typ: Any = pa.string()
    value: Any = "x"
    for _ in range(60):  # 60 lists are 120 schema levels; pyarrow reads 100
        typ, value = pa.list_(typ), [value]
    path = tmp_path / "deep.parquet"
    pq.write_table(pa.table({"messages": pa.array([value], type=typ)}), path)
    with pytest.raises(DataError) as info:
        read_footer(str(path), str(path))
    message = str(info.value)
    assert message.startswith(f"cannot read Parquet shard {path}: ")
    assert "nest deeper than pyarrow reads" in message and "damaged" not in message


# ------------------------------------------------------------------- max_document_bytes


def test_a_value_over_max_document_bytes_is_never_made_a_python_object(tmp_path):
    big = 8 << 20
    texts = ["small 0", "x" * big, "small 2", None]
    path = write(tmp_path / "part.parquet", pa.array(texts, pa.large_string()), 4)
    cache = ShardCache()
    tracemalloc.start()
    try:
        got = cache.read_rows(shard(path), [2, 1, 0, 3], "text", max_document_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == ["small 2", Oversized(big), "small 0", None]
    assert peak < big // 4  # Python objects (Arrow's buffers are not traced)
    assert cache.bytes_cached < big // 4  # nor kept
    # Under a limit it fits, the same row group serves it.
    assert cache.read_rows(shard(path), [1, 0], "text") == [texts[1], "small 0"]


def test_view_column_sizes_come_from_their_buffers():
    values = ["a", None, "x" * 40, "ü", "", None, "tail"]
    views = pa.array(values, pa.string_view())
    column = pa.chunked_array([views.slice(1, 3), views.slice(4)])
    expected = [0 if v is None else len(v.encode()) for v in values[1:4] + values[4:]]
    assert value_sizes(column).tolist() == expected


def test_list_and_struct_sizes_are_their_strings_plus_8_per_scalar_sliced_and_null():
    def size(value: Any) -> int:
        if value is None:
            return 0
        if isinstance(value, str):
            return len(value.encode())
        if isinstance(value, dict):
            return sum(size(v) for v in value.values())
        if isinstance(value, list):
            return sum(size(v) for v in value)
        return 8

    messages = [
        [{"role": "user", "content": "héllo", "weight": 1}],
        None,
        [],
        [{"role": "assistant", "content": None, "weight": 0}, {"role": "user", "content": "x"}],
        [{"role": "tool", "content": "y" * 30, "weight": None}],
    ]
    array = pa.array(messages)
    column = pa.chunked_array([array.slice(1, 3), array.slice(4), array.slice(0, 1)])
    expected = [size(m) for m in messages[1:4] + messages[4:] + messages[:1]]
    assert value_sizes(column).tolist() == expected
    structs = pa.array([{"a": "xy", "b": [1, 2]}, None, {"a": None, "b": []}])
    assert value_sizes(pa.chunked_array([structs])).tolist() == [18, 0, 0]


# ------------------------------------------------------------------ dictionary columns


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_a_dictionary_encoded_text_column_reads_as_the_plain_column(tmp_path, typ):
    texts = ["alpha", None, "beta", "alpha", "gämma", "beta"] * 4
    text = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    column = pa.array([t if t is None or text else t.encode() for t in texts], typ)
    plain = shard(write(tmp_path / "plain.parquet", column, 8))
    coded = shard(write(tmp_path / "coded.parquet", column.dictionary_encode(), 8))
    assert pa.types.is_dictionary(pq.read_schema(coded.path).field("text").type)
    order = [5, 0, 23, 1, 4, 12, 4]
    cache = ShardCache()
    expected = [column[i].as_py() for i in order]
    assert cache.read_rows(coded, order, "text") == cache.read_rows(plain, order, "text")
    assert cache.read_rows(coded, order, "text") == expected
    # Sizes are the values' own: "gämma" is 6 bytes.
    limited = cache.read_rows(coded, order, "text", max_document_bytes=5)
    assert limited == [Oversized(6) if i % 6 == 4 else column[i].as_py() for i in order]


def test_a_dictionary_encoded_column_is_served_like_the_plain_one(tmp_path):
    texts = [f"document {i} " + "é" * (i % 5) for i in range(30)]
    plain = write(tmp_path / "plain" / "part.parquet", texts, 8)
    coded = write(tmp_path / "coded" / "part.parquet", pa.array(texts).dictionary_encode(), 8)
    docs, tombstones, _ = collect(pipeline(coded, "fail"), "inline")
    assert docs == {i: t.encode() for i, t in enumerate(texts)} and not tombstones
    assert docs == collect(pipeline(plain, "fail"), "inline")[0]


def test_a_dictionary_of_numbers_is_still_refused():
    schema = pa.schema([("text", pa.dictionary(pa.int32(), pa.int64()))])
    with pytest.raises(DataError) as info:
        check_field("p.parquet", schema, "text")
    assert str(info.value) == (
        "Parquet shard p.parquet: column 'text' has type dictionary<values=int64, "
        "indices=int32, ordered=0>, expected a string or binary column (set text_field to a "
        "text column)"
    )
