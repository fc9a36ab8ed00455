"""Dataset specs and resolution: directories and globs, formats, row counts, config errors;
plus the sample corpus writer that other tests and the benchmark use."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from zephon_server.engine.corpus import (
    sample_corpus_specs,
    write_jsonl,
    write_jsonl_gz,
    write_parquet,
    write_sample_corpus,
)
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.errors import ConfigError
from zephon_server.engine.shards import ShardCache

pytestmark = pytest.mark.timeout(60)


def rows(n: int, tag: str = "x") -> list[dict[str, str]]:
    return [{"text": f"{tag} {i}"} for i in range(n)]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A directory with shards of every format, nested, plus files that must be ignored."""
    d = tmp_path / "data"
    write_jsonl(d / "b.jsonl", rows(3))
    write_jsonl(d / "a.jsonl", rows(2))
    write_jsonl_gz(d / "sub" / "c.jsonl.gz", rows(4))
    write_jsonl(d / "sub" / "d.jsonl.zst", rows(5))
    write_parquet(d / "sub" / "deeper" / "e.parquet", rows(6), row_group_size=2)
    (d / "README.md").write_text("not data")
    (d / "notes.json").write_text("{}")
    write_jsonl(d / ".hidden.jsonl", rows(100))
    write_jsonl(d / ".cache" / "f.jsonl", rows(100))
    return tmp_path


def test_directory_resolution_recursive_sorted_with_formats(tree: Path) -> None:
    cache = ShardCache()
    [info] = resolve_datasets([DatasetSpec("d", str(tree / "data"), 1.0)], cache=cache)
    names = [os.path.relpath(s.path, tree / "data") for s in info.shards]
    assert names == [
        "a.jsonl",
        "b.jsonl",
        "sub/c.jsonl.gz",
        "sub/d.jsonl.zst",
        "sub/deeper/e.parquet",
    ]
    assert [s.format for s in info.shards] == ["jsonl", "jsonl", "jsonl.gz", "jsonl.zst", "parquet"]
    assert [s.num_rows for s in info.shards] == [2, 3, 4, 5, 6]
    assert info.num_rows == 20
    assert all(os.path.isabs(s.path) for s in info.shards)
    assert [s.size_bytes for s in info.shards] == [os.path.getsize(s.path) for s in info.shards]
    assert info.index == 0 and info.name == "d"


def test_relative_paths_and_globs_resolve_against_base_dir(tree: Path) -> None:
    specs = [
        DatasetSpec("top", "data/*.jsonl", 1.0),
        DatasetSpec("all", "data/**/*.jsonl*", 2.0),
        DatasetSpec("dir", "data/sub", 3.0),
        DatasetSpec("file", "data/sub/deeper/e.parquet", 4.0),
    ]
    infos = resolve_datasets(specs, base_dir=tree, cache=ShardCache())
    assert [i.index for i in infos] == [0, 1, 2, 3]
    assert [Path(s.path).name for s in infos[0].shards] == ["a.jsonl", "b.jsonl"]
    assert [Path(s.path).name for s in infos[1].shards] == [
        "a.jsonl",
        "b.jsonl",
        "c.jsonl.gz",
        "d.jsonl.zst",
    ]
    assert infos[2].num_rows == 15
    assert infos[3].num_rows == 6


def test_format_override_applies_to_pattern_matches(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "x.txt", rows(3))
    write_jsonl(tmp_path / "y.txt", rows(2))
    spec = DatasetSpec("t", str(tmp_path / "*.txt"), 1.0, format="jsonl")
    [info] = resolve_datasets([spec], cache=ShardCache())
    assert [s.format for s in info.shards] == ["jsonl", "jsonl"]
    assert info.num_rows == 5


def test_resolution_reuses_the_line_index(tree: Path) -> None:
    cache = ShardCache()
    [info] = resolve_datasets([DatasetSpec("d", "data/*.jsonl", 1.0)], tree, cache)
    builds = cache.index_builds
    assert cache.read_rows(info.shards[0], [1, 0], "text") == [
        b'{"text": "x 1"}',
        b'{"text": "x 0"}',
    ]
    assert cache.index_builds == builds == 2


def test_missing_path_names_dataset_and_resolved_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_datasets([DatasetSpec("web", "nowhere", 1.0)], base_dir=tmp_path)
    msg = str(err.value)
    assert "'web'" in msg and str(tmp_path / "nowhere") in msg and "does not exist" in msg


def test_directory_without_supported_files_lists_extensions(tree: Path) -> None:
    empty = tree / "empty"
    empty.mkdir()
    (empty / "data.csv").write_text("a,b\n")
    with pytest.raises(ConfigError) as err:
        resolve_datasets([DatasetSpec("csv", str(empty), 1.0)])
    msg = str(err.value)
    assert "'csv'" in msg
    for ext in (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet"):
        assert ext in msg


def test_glob_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="matches no files"):
        resolve_datasets([DatasetSpec("g", str(tmp_path / "*.jsonl"), 1.0)])


def test_single_file_with_unsupported_extension(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "x.json", rows(1))
    with pytest.raises(ConfigError, match="unsupported extension"):
        resolve_datasets([DatasetSpec("f", str(tmp_path / "x.json"), 1.0)])


def test_duplicate_names(tree: Path) -> None:
    specs = [DatasetSpec("d", "data", 1.0), DatasetSpec("d", "data/sub", 1.0)]
    with pytest.raises(ConfigError, match="'d' is defined more than once"):
        resolve_datasets(specs, tree)


def test_zero_rows_in_total_is_an_error_but_empty_shards_are_fine(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "e" / "empty.jsonl", [])
    with pytest.raises(ConfigError, match="hold no rows"):
        resolve_datasets([DatasetSpec("e", str(tmp_path / "e"), 1.0)], cache=ShardCache())
    write_jsonl(tmp_path / "e" / "one.jsonl", rows(1))
    [info] = resolve_datasets([DatasetSpec("e", str(tmp_path / "e"), 1.0)], cache=ShardCache())
    assert [s.num_rows for s in info.shards] == [0, 1]


def test_empty_dataset_list() -> None:
    with pytest.raises(ConfigError, match="at least one dataset"):
        resolve_datasets([])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"weight": 0}, "weight must be > 0, got 0"),
        ({"weight": -1.5}, "weight must be > 0, got -1.5"),
        ({"weight": float("nan")}, "weight must be > 0, got nan"),
        ({"weight": float("inf")}, "weight must be > 0, got inf"),
        ({"weight": True}, "weight must be a number"),
        ({"weight": "1"}, "weight must be a number"),
        ({"on_error": "ignore"}, "on_error must be one of ['fail', 'skip'], got 'ignore'"),
        ({"exhaustion": "loop"}, "exhaustion must be one of ['stop', 'repeat'], got 'loop'"),
        ({"format": "csv"}, "format must be one of"),
        ({"text_field": ""}, "text_field must be a non-empty string"),
        ({"path": ""}, "path must be a non-empty string"),
    ],
)
def test_spec_validation(kwargs: dict[str, object], fragment: str) -> None:
    args: dict[str, object] = {"name": "web", "path": "data", "weight": 1.0, **kwargs}
    with pytest.raises(ConfigError) as err:
        DatasetSpec(**args)  # type: ignore[arg-type]
    assert fragment in str(err.value)
    assert "dataset 'web'" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_spec_name_must_be_non_empty() -> None:
    with pytest.raises(ConfigError, match="dataset name must be a non-empty string"):
        DatasetSpec("  ", "data", 1.0)


def test_sample_corpus_round_trip(tmp_path: Path) -> None:
    specs = write_sample_corpus(tmp_path / "c", docs_per_dataset=40, seed=3)
    assert [(s.name, s.weight, s.text_field) for s in specs] == [
        ("web", 0.5, "text"),
        ("books", 0.3, "text"),
        ("code", 0.2, "content"),
    ]
    assert specs == sample_corpus_specs(tmp_path / "c")
    cache = ShardCache()
    infos = resolve_datasets(specs, cache=cache)
    assert [i.num_rows for i in infos] == [40, 40, 40]
    assert {s.format for s in infos[0].shards} == {"jsonl"}
    assert {s.format for s in infos[1].shards} == {"jsonl.zst"}
    assert {s.format for s in infos[2].shards} == {"parquet"}
    assert len(infos[0].shards) > 1
    for s in infos[2].shards:
        assert pq.ParquetFile(s.path).metadata.num_row_groups > 1
    code = cache.read_rows(infos[2].shards[0], [0], "content")[0]
    assert isinstance(code, str) and code
    book = cache.read_rows(infos[1].shards[0], [0], "text")[0]
    assert isinstance(book, bytes) and b'"title": ' in book


def test_sample_corpus_is_deterministic_and_has_non_ascii(tmp_path: Path) -> None:
    write_sample_corpus(tmp_path / "a", docs_per_dataset=300, seed=1)
    write_sample_corpus(tmp_path / "b", docs_per_dataset=300, seed=1)
    write_sample_corpus(tmp_path / "c", docs_per_dataset=300, seed=2)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.*"))
    assert files
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    first = "web/part-00000.jsonl"
    assert (tmp_path / "a" / first).read_bytes() != (tmp_path / "c" / first).read_bytes()
    all_web = b"".join(p.read_bytes() for p in sorted((tmp_path / "a" / "web").glob("*.jsonl")))
    text = all_web.decode("utf-8")
    assert any(ord(ch) > 127 for ch in text)
    assert not list((tmp_path / "a").rglob("*.tmp"))


def shard_names(info, root: Path) -> list[str]:
    return [os.path.relpath(s.path, root) for s in info.shards]


def test_links_to_directories_are_followed_and_every_file_is_listed_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = tmp_path / "elsewhere"
    write_jsonl(elsewhere / "cc" / "part-1.jsonl", rows(2))
    d = tmp_path / "data"
    write_jsonl(d / "part-0.jsonl", rows(1))
    (d / "cc").symlink_to(elsewhere / "cc")  # a linked directory is part of the dataset
    (d / "sub").mkdir()
    (d / "sub" / "up").symlink_to(d)  # a loop: adds nothing
    (d / "again.jsonl").symlink_to(d / "part-0.jsonl")  # one file, two paths
    with caplog.at_level(logging.WARNING):
        [info] = resolve_datasets([DatasetSpec("d", str(d), 1.0)], cache=ShardCache())
    assert shard_names(info, d) == ["cc/part-1.jsonl", "part-0.jsonl"]
    [warned] = [r.getMessage() for r in caplog.records]
    assert warned.startswith("dataset 'd': 1 listed file path(s) lead to a file listed already")
    assert f"(e.g. {d / 'again.jsonl'} is {d / 'part-0.jsonl'}, through a link)" in warned


def test_a_glob_through_a_link_loop_lists_each_file_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "b"
    write_jsonl(d / "sub" / "part-0.jsonl", rows(1))
    (d / "sub" / "up").symlink_to(Path(".."))  # Python's glob walked it 40 levels deep
    (d / "sub" / "down").symlink_to(Path("..") / "sub")  # a second loop: 2**40 walks
    with caplog.at_level(logging.WARNING):
        [info] = resolve_datasets([DatasetSpec("g", str(d / "**" / "*.jsonl"), 1.0)])
    assert shard_names(info, d) == ["sub/part-0.jsonl"] and info.num_rows == 1
    assert not caplog.records  # no second path was even walked


def test_files_that_look_like_data_but_are_not_read_are_named(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("x.ndjson", "y.jsonl.bz2", "z.jsonl.gz.part"):
        (tree / "data" / "sub" / name).write_text("{}\n")
    with caplog.at_level(logging.INFO, logger="zephon_server.engine.ignored_files"):
        resolve_datasets([DatasetSpec("d", str(tree / "data"), 1.0)], cache=ShardCache())
    warned, counted = (r.getMessage() for r in caplog.records)
    assert warned.startswith(f"dataset 'd': 4 file(s) in directory '{tree / 'data'}' look like")
    assert warned.endswith(
        ": notes.json, sub/x.ndjson, sub/y.jsonl.bz2, sub/z.jsonl.gz.part; rename or convert "
        "them, or select them with a glob and set format"
    )
    assert counted.endswith(
        f"1 other file(s) in directory '{tree / 'data'}' are not shards and are not read"
    )
