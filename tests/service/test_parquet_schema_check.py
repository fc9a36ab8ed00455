"""The start-up check of every Parquet shard's text column, as users meet it: ``zephon
explain`` exits with status 2 naming the shard (a subprocess), and object-store shards are
checked cold and from the catalog like local ones (the S3 server). The in-process tests are in
``tests/unit/test_parquet_schema_check.py``.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from tests.service.test_cli import zephon
from tests.service.test_storage_s3 import options
from tests.unit.test_parquet_schema_check import ROWS, cache_on, mixed
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.errors import DataError

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_explain_stops_under_fail_and_warns_under_skip(tmp_path: Path, on_error: str) -> None:
    data = mixed(tmp_path / "ds")
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "datasets": [{"name": "web", "path": "ds", "weight": 1, "on_error": on_error}],
                "pipeline": ["tokenize", {"batch": {"microbatch_size": 4}}],
            }
        )
    )
    found = (
        f"dataset 'web': 1 of its 3 Parquet shards ({ROWS} rows) has no text column 'text' (a "
        f"string or binary column); the first is {data / 'part-1.parquet'}, whose columns are "
        "[content: string]"
    )
    for _ in ("cold", "warm"):
        res = zephon("explain", "--config", str(config), "--index-dir", str(tmp_path / "index"))
        if on_error == "fail":
            assert res.returncode == 2 and res.stdout == ""
            assert f"zephon: error: {found}; set the dataset's text_field" in res.stderr
        else:
            assert res.returncode == 0, res.stderr
            assert f"WARNING zephon_server.engine.text_columns: {found}; with on_error: skip" in (
                res.stderr
            )
            assert f"rows={3 * ROWS} on_error=skip" in res.stdout
    assert len(list((tmp_path / "index").glob("catalogs/*.zsc"))) == 1


def test_object_store_shards_are_checked_cold_and_from_the_catalog(s3, tmp_path: Path) -> None:
    bucket = s3.bucket(f"t-{uuid.uuid4().hex[:16]}")
    s3.upload_tree(mixed(tmp_path / "ds"), bucket, "ds")
    spec = DatasetSpec("web", f"s3://{bucket}/ds/", 1.0, storage_options=options(s3.endpoint))
    messages = []
    for cache in (cache_on(tmp_path / "index"), cache_on(tmp_path / "index")):
        with pytest.raises(DataError) as info:
            resolve_datasets([spec], cache=cache)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "has no text column 'text'" in messages[0]
    assert (
        f"the first is s3://{bucket}/ds/part-1.parquet, whose columns are [content: string]"
        in (messages[0])
    )
    assert cache.stats()["catalog_hits"] == 1 and cache.stats()["footer_reads"] == 0


def test_zephon_index_says_what_a_start_would_refuse(tmp_path: Path) -> None:
    data = mixed(tmp_path / "ds")
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "datasets": [{"name": "web", "path": "ds", "weight": 1}],
                "pipeline": ["tokenize", {"batch": {"microbatch_size": 4}}],
            }
        )
    )
    res = zephon("index", "--config", str(config), "--index-dir", str(tmp_path / "index"))
    assert res.returncode == 0, res.stderr  # the index itself is complete
    assert res.stdout.startswith("indexed 3 shards of 1 dataset(s)")
    assert (
        "zephon index: warning: dataset 'web': 1 of its 3 Parquet shards "
        f"({ROWS} rows) has no text column 'text'"
    ) in res.stderr
    assert f"the first is {data / 'part-1.parquet'}" in res.stderr
    assert res.stderr.rstrip().endswith("a server with this config stops at start-up until then")
