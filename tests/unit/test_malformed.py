"""Malformed records follow the dataset's policy: fail naming file and line, or skip+count."""

from __future__ import annotations

from collections import Counter

import pytest

from zephon_server.engine.datasets import DatasetSpec
from zephon_server.engine.errors import DataError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline

GOOD = [b'{"text": "good record number %d"}' % i for i in range(20)]
BAD = {
    3: b"{not json",
    7: b'{"body": "no text field"}',
    11: b'{"text": "\xff\xfe broken utf8"}',
    15: b'["an", "array"]',
    18: b'{"text": 42}',
}


@pytest.fixture
def bad_shard(tmp_path):
    lines = [BAD.get(i, line) for i, line in enumerate(GOOD)]
    path = tmp_path / "bad" / "part0.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def pipeline(path, on_error, drop_last=False):
    spec = DatasetSpec("web", str(path.parent), 1.0, on_error=on_error)
    return (
        Pipeline([spec], seed=1, lanes=2, chunk_size=4, flush_every_k_chunks=2)
        .decode_text()
        .tokenize()
        .batch(microbatch_size=2, drop_last=drop_last)
    )


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_fail_policy_names_file_and_line(bad_shard, runner):
    with pytest.raises(DataError) as info:
        list(pipeline(bad_shard, "fail").run(ExecutionConfig(runner=runner, workers=2)))
    message = str(info.value)
    assert str(bad_shard) in message
    assert any(f"line {i + 1}:" in message for i in BAD)
    assert "on_error: skip" in message


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_skip_policy_counts_and_closes_with_tombstones(bad_shard, runner):
    run = pipeline(bad_shard, "skip").run(ExecutionConfig(runner=runner, workers=2))
    rows, tombstones = Counter(), Counter()
    for item in run:
        if isinstance(item, NumberedBatch):
            rows.update(span.doc.row for meta in item.rows for span in meta.spans)
            tombstones.update((m.doc.row, m.tombstone) for m in item.tombstones)
    for log in run.logs.values():
        tombstones.update((m.doc.row, m.tombstone) for m in log.tail_tombstones)
    assert sorted(rows) == sorted(set(range(20)) - set(BAD))
    assert sorted(tombstones) == sorted((i, "malformed") for i in BAD)
    assert run.stats()["skipped"] == {"web": len(BAD)}


def test_parquet_null_text_is_malformed(tmp_path):
    from zephon_server.engine.corpus import write_parquet

    path = tmp_path / "pq" / "part0.parquet"
    path.parent.mkdir()
    write_parquet(
        path, [{"content": "fine"}, {"content": None}, {"content": "also fine"}], row_group_size=2
    )
    spec = DatasetSpec("code", str(path.parent), 1.0, text_field="content")
    pipe = Pipeline([spec], lanes=1, chunk_size=4).decode_text().tokenize().batch(microbatch_size=1)
    with pytest.raises(DataError, match=r"part0.parquet:row 1: missing text field 'content'"):
        list(pipe.run(ExecutionConfig(runner="inline")))


def invalid_utf8_parquet(path, rows: list[str], bad: int) -> None:
    """A Parquet shard whose string column holds invalid UTF-8 at row ``bad`` (pyarrow writes
    and reads such bytes without checking them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir()
    marked = [("X" * len(r) if i == bad else r) for i, r in enumerate(rows)]
    pq.write_table(pa.table({"text": marked}), path, compression="NONE", row_group_size=4)
    data = bytearray(path.read_bytes())
    at = data.find(b"X" * len(rows[bad]))
    data[at : at + 2] = b"\xff\xfe"
    path.write_bytes(bytes(data))


def parquet_texts(path, on_error: str) -> tuple[list[str], dict]:
    spec = DatasetSpec("pq", str(path.parent), 1.0, on_error=on_error)
    pipe = Pipeline([spec], lanes=1, chunk_size=4).decode_text().tokenize().batch(microbatch_size=1)
    run = pipe.run(ExecutionConfig(runner="inline"))
    texts = [
        bytes(int(t) for t in item.tensors["input_ids"][0] if t < 256).decode()
        for item in run
        if isinstance(item, NumberedBatch)
    ]
    return sorted(texts), run.stats()["skipped"]


def test_parquet_invalid_utf8_is_that_rows_problem(tmp_path):
    # It was an UnicodeDecodeError of the whole row group, under skip too: the good rows lost.
    rows = [f"good row {i:02d}" for i in range(7)]
    path = tmp_path / "pq" / "part0.parquet"
    invalid_utf8_parquet(path, rows, bad=5)
    with pytest.raises(DataError, match=r"part0.parquet:row 5: invalid UTF-8 \(invalid start byte"):
        parquet_texts(path, "fail")
    texts, skipped = parquet_texts(path, "skip")
    assert texts == sorted(r for i, r in enumerate(rows) if i != 5) and skipped == {"pq": 1}


def test_parquet_binary_text_column_is_read_as_utf8(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bin" / "part0.parquet"
    path.parent.mkdir()
    values = ["plain", "Zürich ✓", "\xff is ÿ"]
    pq.write_table(pa.table({"text": pa.array([v.encode() for v in values], pa.binary())}), path)
    assert parquet_texts(path, "fail") == (sorted(values), {})


def test_a_utf16_file_and_a_lone_surrogate_escape_say_what_they_are(tmp_path):
    path = tmp_path / "u16" / "part0.jsonl"
    path.parent.mkdir()
    path.write_bytes('{"text": "one"}\n{"text": "two"}\n'.encode("utf-16"))
    with pytest.raises(DataError, match=r"line \d: .*is the file UTF-16 \(or binary\)\?"):
        list(pipeline(path, "fail").run(ExecutionConfig(runner="inline")))
    path.write_bytes(b'{"text": "fine"}\n{"text": "half a pair \\ud83d"}\n')
    with pytest.raises(DataError, match=r"line 2: a lone surrogate in the text \(a JSON escape"):
        list(pipeline(path, "fail").run(ExecutionConfig(runner="inline")))
    path.write_bytes(b'{"text": "fine"}\n\n')  # a blank line at the end
    with pytest.raises(DataError, match=r"line 2: bad JSON .*; the line is blank: every line"):
        list(pipeline(path, "fail").run(ExecutionConfig(runner="inline")))
