"""One bad record never stops the pipeline unless its dataset says so.

Any failure decoding or tokenizing one record (JSON nested 1,000 or 100,000 levels deep, a
number too long to convert, a text the tokenizer cannot take) and any document larger than
the dataset's ``max_document_bytes`` go through the dataset's ``on_error``: ``fail`` raises a
DataError naming dataset, file, line or row, what is wrong and the fix; ``skip`` closes the
record with a tombstone, counts it, and every other record comes out exactly as it would
have. In-process on the inline and threads runners, plus one real server read to the end.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_parquet
from zephon_server.engine.datasets import DEFAULT_MAX_DOCUMENT_BYTES, DatasetSpec
from zephon_server.engine.errors import ConfigError, DataError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline, fingerprint_document
from zephon_testing.scenarios.bad_records import (
    HUGE_NUMBER,
    LIMIT,
    deep,
    fails_to_parse,
    good,
    write_lines,
)

pytestmark = pytest.mark.timeout(60)

RUNNERS = ["inline", "threads"]
EOS = 257  # the byte tokenizer's


def pipeline(spec: DatasetSpec, *, map_fn: Any = None) -> Pipeline:
    # Every good document must be delivered: each lane runs to its own end (with end_of_data
    # shortest the longer lane's last batches would be cut, their documents closed as cut).
    pipe = Pipeline(
        [spec], seed=3, lanes=2, chunk_size=4, flush_every_k_chunks=2, end_of_data="longest"
    ).decode_text()
    if map_fn is not None:
        pipe.map_transform(fn=map_fn)
    return pipe.tokenize().batch(microbatch_size=3, drop_last=False)


def collect(pipe: Pipeline, runner: str) -> tuple[dict[int, bytes], Counter, dict[str, Any]]:
    """Delivered documents (row -> token bytes without EOS), tombstones (row, reason), stats."""
    run = pipe.run(ExecutionConfig(runner=runner, workers=2))
    docs: dict[int, bytes] = {}
    tombstones: Counter = Counter()
    for item in run:
        if not isinstance(item, NumberedBatch):
            continue
        ids, mask = item.tensors["input_ids"], item.tensors["padding_mask"]
        for i, meta in enumerate(item.rows):
            row_ids = ids[i][mask[i]]
            assert row_ids[-1] == EOS and meta.doc.row not in docs
            docs[meta.doc.row] = bytes(row_ids[:-1].astype(np.uint8))
        tombstones.update((m.doc.row, m.tombstone) for m in item.tombstones)
    for log in run.logs.values():
        tombstones.update((m.doc.row, m.tombstone) for m in log.tail_tombstones)
    return docs, tombstones, run.stats()


def texts(lines: dict[int, bytes]) -> dict[int, bytes]:
    return {row: json.loads(line)["text"].encode() for row, line in lines.items()}


# ------------------------------------------------------------------ records that do not parse


@pytest.fixture
def nested_shard(tmp_path: Path) -> tuple[Path, dict[int, bytes], set[int]]:
    lines = {i: good(i) for i in range(30)}
    lines.update({4: deep(1_000), 11: deep(100_000), 19: HUGE_NUMBER, 23: deep(100_000)})
    path = write_lines(tmp_path / "nested" / "part-0.jsonl", [lines[i] for i in range(30)])
    bad = {i for i, line in lines.items() if fails_to_parse(line)}
    assert {11, 19, 23} <= bad  # 100,000 levels fail on any Python; 1,000 on 3.11's limit
    return path, lines, bad


@pytest.mark.parametrize("runner", RUNNERS)
def test_records_that_do_not_parse_are_skipped_counted_and_closed_once(nested_shard, runner):
    path, lines, bad = nested_shard
    spec = DatasetSpec("nested", str(path), 1.0, on_error="skip")
    docs, tombstones, stats = collect(pipeline(spec), runner)
    assert docs == texts({i: line for i, line in lines.items() if i not in bad})
    assert tombstones == Counter((i, "malformed") for i in bad)
    assert stats["skipped"] == {"nested": len(bad)}


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("levels", [1_000, 100_000])
def test_deep_nesting_fails_naming_file_line_exception_and_fix(tmp_path, runner, levels):
    lines = [good(i) for i in range(12)]
    lines[7] = deep(levels)
    if not fails_to_parse(lines[7]):
        pytest.fail(f"this Python parses {levels} levels; the test needs a deeper record")
    path = write_lines(tmp_path / "deep" / "part-0.jsonl", lines)
    spec = DatasetSpec("deep", str(path), 1.0)
    with pytest.raises(DataError) as info:
        collect(pipeline(spec), runner)
    message = str(info.value)
    assert message.startswith(
        f"dataset 'deep': {path}:line 8: JSON nested too deeply to parse (RecursionError: "
        "maximum recursion depth exceeded"
    ), message
    assert message.endswith(
        "; fix the record or set on_error: skip on dataset 'deep' to skip and count such records"
    )


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_number_too_long_to_convert_fails_naming_the_exception(tmp_path, runner):
    lines = [good(i) for i in range(6)]
    lines[2] = HUGE_NUMBER
    path = write_lines(tmp_path / "num" / "part-0.jsonl", lines)
    with pytest.raises(DataError, match=rf"{path}:line 3: cannot parse the record \(ValueError: "):
        collect(pipeline(DatasetSpec("num", str(path), 1.0)), runner)


# ------------------------------------------------------------ records the tokenizer fails on


def break_row_9(payload: dict[str, Any]) -> dict[str, Any]:
    """A user transform with a bug on one record: its text becomes a number."""
    return {"text": 9} if payload["text"].startswith("good record number 9 ") else payload


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_record_the_tokenizer_fails_on_is_found_and_skipped(tmp_path, runner):
    lines = {i: good(i) for i in range(20)}
    path = write_lines(tmp_path / "tok" / "part-0.jsonl", [lines[i] for i in range(20)])
    spec = DatasetSpec("tok", str(path), 1.0, on_error="skip")
    docs, tombstones, stats = collect(pipeline(spec, map_fn=break_row_9), runner)
    # Every other record of row 9's micro-batch is tokenized exactly as without it.
    assert docs == texts({i: line for i, line in lines.items() if i != 9})
    assert tombstones == Counter({(9, "tokenize_error"): 1})
    assert stats["skipped"] == {"tok": 1}


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_record_the_tokenizer_fails_on_fails_naming_it(tmp_path, runner):
    path = write_lines(tmp_path / "tok" / "part-0.jsonl", [good(i) for i in range(20)])
    spec = DatasetSpec("tok", str(path), 1.0)
    with pytest.raises(DataError) as info:
        collect(pipeline(spec, map_fn=break_row_9), runner)
    assert str(info.value).startswith(
        f"dataset 'tok': {path}:line 10: the tokenizer failed on this record (AttributeError: "
    ), str(info.value)
    assert "set on_error: skip on dataset 'tok'" in str(info.value)


def test_hf_tokenizer_fallback_gives_good_records_their_batched_ids(tmp_path):
    """With a Hugging Face tokenizer: the batched call raises on one record, the others get
    exactly the ids one batched call over them gives."""
    from zephon_server.engine.ops.tokenize import Tokenize
    from zephon_server.engine.records import DocRef, SampleMeta, SampleRecord
    from zephon_server.engine.tokenizer import train_bpe_tokenizer

    corpus = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(50)]
    tok_path = train_bpe_tokenizer(corpus, tmp_path / "tokenizer.json", vocab_size=300)
    op = Tokenize(tokenizer=str(tok_path))
    op._replay_cache = None
    recs = [
        SampleRecord({"text": t}, SampleMeta(0, (0, i), 0, DocRef(0, 0, i)))
        for i, t in enumerate(corpus[:8])
    ]
    recs[3] = SampleRecord({"text": b"bytes, not text"}, recs[3].meta)
    ids, failed = op._encode_texts(recs)
    assert list(failed) == [3] and isinstance(failed[3], TypeError)
    expected = op.tokenizer.encode_batch(
        [r.payload["text"] for i, r in enumerate(recs) if i != 3], suffix=(op.tokenizer.eos_id,)
    )
    assert [a.tolist() for i, a in enumerate(ids) if i != 3] == [a.tolist() for a in expected]
    # A lone surrogate (decode_text refuses one in a row; a transform can make one) is named
    # as such, not by the tokenizer binding's complaint about its input type.
    recs[3] = SampleRecord({"text": "half a pair: \ud83d here"}, recs[3].meta)
    with pytest.raises(DataError, match=r"tokenize: the text holds a lone surrogate \(U\+D83D at "):
        op.process_many(recs)


# ------------------------------------------------------------------------ max_document_bytes

BIG = 5 * 2**20  # a 5 MB document


def big_corpus(tmp_path: Path, fmt: str) -> tuple[Path, dict[int, str]]:
    text = {i: f"small document {i} " * 8 for i in range(24)}
    text[12] = "x" * BIG
    if fmt == "parquet":
        path = tmp_path / "big" / "part-0.parquet"
        path.parent.mkdir(parents=True)
        write_parquet(path, [{"text": text[i]} for i in range(24)], row_group_size=8)
    else:
        path = write_lines(
            tmp_path / "big" / f"part-0.{fmt}",
            [json.dumps({"text": text[i]}).encode() for i in range(24)],
        )
        if fmt == "jsonl.zst":
            import zstandard

            path.rename(path.with_suffix(""))
            raw = path.with_suffix("").read_bytes()
            path.with_suffix("").unlink()
            path = path.with_suffix(".zst")
            path.write_bytes(zstandard.ZstdCompressor().compress(raw))
    return path, text


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst", "parquet"])
def test_a_document_over_max_document_bytes_is_skipped_as_too_large(tmp_path, fmt, runner):
    path, text = big_corpus(tmp_path, fmt)
    spec = DatasetSpec("big", str(path), 1.0, on_error="skip", max_document_bytes=LIMIT)
    docs, tombstones, stats = collect(pipeline(spec), runner)
    assert docs == {i: t.encode() for i, t in text.items() if i != 12}
    assert tombstones == Counter({(12, "too_large"): 1})
    assert stats["skipped"] == {"big": 1} and stats["tombstones"] == {"too_large": 1}
    # Under the default limit the same document is served like any other.
    docs, tombstones, _ = collect(pipeline(DatasetSpec("big", str(path), 1.0)), runner)
    assert docs == {i: t.encode() for i, t in text.items()} and not tombstones


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst", "parquet"])
def test_a_document_over_max_document_bytes_fails_naming_size_and_limit(tmp_path, fmt):
    path, _ = big_corpus(tmp_path, fmt)
    spec = DatasetSpec("big", str(path), 1.0, max_document_bytes=LIMIT)
    with pytest.raises(DataError) as info:
        collect(pipeline(spec), "inline")
    where = "row 12" if fmt == "parquet" else "line 13"
    size = BIG if fmt == "parquet" else BIG + len('{"text": ""}')
    assert str(info.value) == (
        f"dataset 'big': {path}:{where}: document of {size} bytes is larger than "
        f"max_document_bytes ({LIMIT}); raise max_document_bytes on dataset 'big' or remove "
        "the document or set on_error: skip on dataset 'big' to skip and count such records"
    )


def test_an_oversized_plain_jsonl_row_is_never_read(tmp_path, monkeypatch):
    from zephon_server.engine import shards as shards_mod
    from zephon_server.engine.datasets import ShardInfo
    from zephon_server.engine.shards import Oversized, ShardCache

    path, text = big_corpus(tmp_path, "jsonl")
    read: list[int] = []
    real_pread = shards_mod.os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        read.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(shards_mod.os, "pread", pread)
    st = path.stat()
    shard = ShardInfo(str(path), "jsonl", st.st_size, 24, st.st_mtime_ns)
    got = ShardCache().read_rows(shard, [11, 12, 13], "text", max_document_bytes=LIMIT)
    assert got[1] == Oversized(BIG + len('{"text": ""}'))
    assert [json.loads(got[i])["text"] for i in (0, 2)] == [text[11], text[13]]  # type: ignore[arg-type]
    assert sum(read) < 1000, read


def test_max_document_bytes_default_validation_yaml_and_fingerprint(tmp_path):
    assert DEFAULT_MAX_DOCUMENT_BYTES == 67_108_864
    assert DatasetSpec("a", "p", 1.0).max_document_bytes == 67_108_864
    for bad in (0, -1, 1.5, True, "1MB", None):
        with pytest.raises(
            ConfigError,
            match=rf"dataset 'a': max_document_bytes must be an "
            rf"integer >= 1, got {bad!r}",
        ):
            DatasetSpec("a", "p", 1.0, max_document_bytes=bad)  # type: ignore[arg-type]
    path = write_lines(tmp_path / "d" / "part-0.jsonl", [good(i) for i in range(4)])
    cfg = yaml.safe_load(
        f"datasets: [{{name: d, path: {path}, weight: 1, max_document_bytes: 4096}}]\n"
        "pipeline: [decode_text, tokenize, {batch: {microbatch_size: 2}}]\n"
    )
    pipe, _ = parse_config(cfg)
    assert pipe.datasets[0].max_document_bytes == 4096

    def entry(limit: int) -> dict[str, Any]:
        spec = DatasetSpec("d", str(path), 1.0, max_document_bytes=limit)
        p = Pipeline([spec]).decode_text().tokenize().batch(microbatch_size=2)
        return fingerprint_document(p, p.plan(ExecutionConfig()).datasets)["datasets"][0]

    assert "max_document_bytes" not in entry(DEFAULT_MAX_DOCUMENT_BYTES)  # fingerprints kept
    assert entry(4096)["max_document_bytes"] == 4096


# ------------------------------------------------------------------ a real server, to the end
