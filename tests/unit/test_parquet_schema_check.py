"""Every Parquet shard's text column is checked at start-up, before the first batch: under
``on_error: fail`` a shard without it stops the start naming it, under ``skip`` a warning
says its rows will be skipped; the same cold (no index), warm (the dataset's catalog, no
footer read) and in memory; an index written before the catalogs held columns is recounted,
never trusted. The CLI's exit status is in ``tests/service/test_parquet_schema_check.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_server.engine import index_catalog, shard_index
from zephon_server.engine.config import parse_config
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets, shard_keys
from zephon_server.engine.errors import DataError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.index_builder import build_index, list_jobs
from zephon_server.engine.index_catalog import CATALOG_MAGIC
from zephon_server.engine.index_dir import IndexDir
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.shard_index import ShardIndex, encode_entry, seal
from zephon_server.engine.shards import ShardCache

pytestmark = pytest.mark.timeout(60)

ROWS = 40


def texts(i: int) -> list[str]:
    return [f"shard {i} document {j} " + "word " * (j % 7) for j in range(ROWS)]


def write_dataset(root: Path, columns: list[dict[str, Any]]) -> Path:
    """One Parquet shard per mapping of columns (``part-<i>.parquet``) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for i, table in enumerate(columns):
        pq.write_table(pa.table(table), root / f"part-{i}.parquet", row_group_size=16)
    return root


def mixed(root: Path) -> Path:
    """Three shards; the middle one names its text column ``content``."""
    return write_dataset(root, [{"text": texts(0)}, {"content": texts(1)}, {"text": texts(2)}])


def cache_on(index_dir: Path | None) -> ShardCache:
    """A new process's cache: on ``index_dir``, or in memory only (``--index-dir none``)."""
    if index_dir is None:
        return ShardCache()
    return ShardCache(index=ShardIndex(IndexDir(str(index_dir))))


def resolve(data: Path, on_error: str, cache: ShardCache) -> int:
    """Resolve the one dataset of a parsed config; its row count."""
    pipe, _ = parse_config(
        {
            "datasets": [{"name": "web", "path": str(data), "weight": 1, "on_error": on_error}],
            "pipeline": ["tokenize", {"batch": {"microbatch_size": 4}}],
        }
    )
    (info,) = resolve_datasets(pipe.datasets, cache=cache)
    return info.num_rows


def start_error(data: Path, cache: ShardCache) -> str:
    with pytest.raises(DataError) as info:
        resolve(data, "fail", cache)
    return str(info.value)


def test_a_shard_without_the_text_column_stops_the_start_cold_warm_and_in_memory(
    tmp_path: Path,
) -> None:
    data, index_dir = mixed(tmp_path / "ds"), tmp_path / "index"
    cold = cache_on(index_dir)
    message = start_error(data, cold)
    assert message == (
        f"dataset 'web': 1 of its 3 Parquet shards ({ROWS} rows) has no text column 'text' (a "
        f"string or binary column); the first is {data / 'part-1.parquet'}, whose columns are "
        "[content: string]; set the dataset's text_field to the column holding the text, or "
        "fix or remove those shards"
    )
    assert cold.stats()["footer_reads"] == 3 and cold.stats()["catalog_writes"] == 1
    warm = cache_on(index_dir)
    assert start_error(data, warm) == message
    stats = warm.stats()
    assert stats["catalog_hits"] == 1 and stats["footer_reads"] == 0  # from the catalog alone
    assert stats["index_reads"] == 0
    assert start_error(data, cache_on(None)) == message  # --index-dir none


def test_every_lacking_shard_is_counted_and_the_first_named(tmp_path: Path) -> None:
    data = write_dataset(
        tmp_path / "ds",
        [
            {"text": texts(0)},
            {"text": list(range(ROWS)), "body": texts(1)},  # not text
            {"content": texts(2)},
            {"text": pa.array(texts(3), pa.large_string())},
            {"id": [], "empty": pa.array([], pa.string())},  # no rows: never read
        ],
    )
    message = start_error(data, cache_on(None))
    assert message.startswith(
        f"dataset 'web': 2 of its 5 Parquet shards ({2 * ROWS} rows) have no text column 'text'"
    )
    assert f"the first is {data / 'part-1.parquet'}, whose columns are [text: int64, body: " in (
        message
    )


def test_under_skip_the_start_warns_and_the_run_is_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data, index_dir = mixed(tmp_path / "ds"), tmp_path / "index"
    caplog.set_level(logging.WARNING, logger="zephon_server.engine.text_columns")
    caches = [cache_on(index_dir), cache_on(index_dir), cache_on(None)]  # cold, warm, memory
    for cache in caches:
        caplog.clear()
        assert resolve(data, "skip", cache) == 3 * ROWS
        (record,) = caplog.records
        assert record.getMessage() == (
            f"dataset 'web': 1 of its 3 Parquet shards ({ROWS} rows) has no text column 'text' "
            f"(a string or binary column); the first is {data / 'part-1.parquet'}, whose "
            "columns are [content: string]; with on_error: skip their rows will be skipped and "
            "counted as read_error (set the dataset's text_field to the column holding the "
            "text, or fix or remove those shards)"
        )
    assert [cache.stats()["catalog_hits"] for cache in caches] == [0, 1, 0]
    # The run serves what it served before the check: the shard's rows are read_error.
    spec = DatasetSpec("web", str(data), 1.0, on_error="skip")
    pipe = Pipeline([spec], seed=3, lanes=2, chunk_size=8, end_of_data="longest")
    pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=4, drop_last=False)
    run = pipe.run(ExecutionConfig(runner="inline"))
    served: set[tuple[int, int]] = set()
    lost: Counter[tuple[str, int]] = Counter()
    for item in run:
        if isinstance(item, NumberedBatch):
            served.update((m.doc.shard, m.doc.row) for m in item.rows)
            lost.update((m.tombstone, m.doc.shard) for m in item.tombstones)
    for log in run.logs.values():
        lost.update((m.tombstone, m.doc.shard) for m in log.tail_tombstones)
    assert served == {(shard, row) for shard in (0, 2) for row in range(ROWS)}
    assert lost == {("read_error", 1): ROWS}


def test_a_dictionary_encoded_text_column_is_accepted_cold_and_warm(tmp_path: Path) -> None:
    coded = pa.array(texts(1)).dictionary_encode()  # as a pandas Categorical is written
    data = write_dataset(
        tmp_path / "ds", [{"text": texts(0)}, {"text": coded}, {"text": list(range(ROWS))}]
    )
    assert pa.types.is_dictionary(pq.read_schema(data / "part-1.parquet").field("text").type)
    index_dir = tmp_path / "index"
    for cache in (cache_on(index_dir), cache_on(index_dir)):  # cold, then from the catalog
        message = start_error(data, cache)
        assert message.startswith("dataset 'web': 1 of its 3 Parquet shards")
        assert f"the first is {data / 'part-2.parquet'}, whose columns are [text: int64]" in (
            message
        )
    assert cache.stats()["catalog_hits"] == 1 and cache.stats()["footer_reads"] == 0
    (catalog,) = index_dir.glob("catalogs/*.zsc")
    assert b"dictionary<values=string, indices=int32, ordered=0>" in catalog.read_bytes()
    (data / "part-2.parquet").unlink()
    for cache in (cache_on(index_dir), cache_on(index_dir)):
        assert resolve(data, "fail", cache) == 2 * ROWS
    assert cache.stats()["catalog_hits"] == 1


def test_zephon_index_writes_the_catalog_a_start_checks_from(tmp_path: Path) -> None:
    data, built, served = mixed(tmp_path / "ds"), tmp_path / "built", tmp_path / "served"
    spec = DatasetSpec("web", str(data), 1.0)
    builder = ShardCache(index=ShardIndex(IndexDir(str(built))), max_open_indexes=0)
    build_index(list_jobs([spec], str(tmp_path)), builder, workers=2)
    warm = cache_on(built)
    message = start_error(data, warm)
    assert warm.stats()["catalog_hits"] == 1 and warm.stats()["footer_reads"] == 0
    assert start_error(data, cache_on(served)) == message
    (by_index,) = built.glob("catalogs/*.zsc")
    (by_server,) = served.glob("catalogs/*.zsc")
    assert by_index.name == by_server.name and by_index.read_bytes() == by_server.read_bytes()


# ------------------------------------------------------------ an index of the old version


def old_name(doc: dict[str, Any], sort_keys: bool) -> str:
    """The hash an index file of the previous version is named by."""
    text = json.dumps(doc, sort_keys=sort_keys, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class OldKey:
    """An entry key of version 1 (what :func:`encode_entry` stores of a key)."""

    location: str
    identity: str
    format: str

    def document(self) -> dict[str, Any]:
        return {**asdict(self), "version": 1}


def write_old_index(index_dir: Path, data: Path) -> None:
    """The index a start made before entries and catalogs held columns, in that encoding (by
    hand): Parquet entries of version 1 without columns, a catalog of version 1 with only
    the row counts."""
    _, keys = shard_keys([(str(p), "parquet") for p in sorted(data.glob("*.parquet"))])
    bounds = np.array([0, 16, 32, ROWS], dtype=np.int64)  # row groups of 16
    for key in (OldKey(*k) for k in keys):
        digest = old_name(key.document(), sort_keys=True)
        path = index_dir / "entries" / digest[:2] / f"{digest}.zsi"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_entry(key, ROWS, {"row_groups": bounds}))  # type: ignore[arg-type]
    listing = [list(k) for k in keys]
    path = index_dir / "catalogs" / f"{old_name({'version': 1, 'shards': listing}, False)}.zsc"
    path.parent.mkdir(parents=True)
    body = {"key": {"version": 1, "shards": listing}, "rows": [ROWS] * len(keys)}
    path.write_bytes(seal(CATALOG_MAGIC, json.dumps(body).encode()))


def test_an_index_of_the_previous_version_is_recounted_not_trusted(tmp_path: Path) -> None:
    data, index_dir = mixed(tmp_path / "ds"), tmp_path / "index"
    write_old_index(index_dir, data)
    cache = cache_on(index_dir)
    message = start_error(data, cache)
    assert "1 of its 3 Parquet shards" in message and "[content: string]" in message
    stats = cache.stats()
    assert stats["catalog_hits"] == 0 and stats["index_reads"] == 0  # another name
    assert stats["footer_reads"] == 3 and stats["catalog_writes"] == 1


def test_a_catalog_or_entry_without_columns_is_never_read_even_under_the_same_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Were the versions not bumped, the old files would be found: they must be refused
    for lacking the columns, not pass the check for it."""
    data, index_dir = mixed(tmp_path / "ds"), tmp_path / "index"
    write_old_index(index_dir, data)
    monkeypatch.setattr(shard_index, "FORMAT_VERSIONS", {}, raising=False)
    monkeypatch.setattr(index_catalog, "CATALOG_VERSION", 1)
    caplog.set_level(logging.WARNING)
    cache = cache_on(index_dir)
    start_error(data, cache)
    problems = [r.getMessage() for r in caplog.records]
    assert any("index catalog without the shards' columns" in p for p in problems)
    assert sum("index entry without the file's columns" in p for p in problems) == 3
    assert cache.stats()["footer_reads"] == 3 and cache.stats()["catalog_hits"] == 0
