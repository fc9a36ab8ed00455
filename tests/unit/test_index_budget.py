"""The index directory's byte budget (issue 20 leftovers): orphan entries go first, then the
least recently used catalogs with their entries; what the process uses is never removed; a
process that has an entry mapped keeps reading it and one that finds it gone rebuilds it;
start-up, ``zephon index`` and ``zephon index --prune`` enforce it; an object-store index
goes through the same code.

A "process" is a fresh :class:`ShardCache` on the same directory unless a real subprocess is
needed (marked ``service``).

The tests of the same topic that need a subprocess, worker processes, a socket or a real
file system limit are in ``tests/service/test_index_budget.py``.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest
import yaml

from zephon_server.cli import main
from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_jsonl
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.errors import ConfigError, ZephonError
from zephon_server.engine.execution import ExecutionConfig, byte_size
from zephon_server.engine.index_budget import enforce, max_bytes_of, prune
from zephon_server.engine.index_dir import IndexDir
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.shard_index import EntryKey, ShardIndex, encode_entry
from zephon_server.engine.shards import ShardCache, cache_for
from zephon_server.pipeline_flags import budgets_from_args

pytestmark = pytest.mark.timeout(60)

ROWS = [json.dumps({"text": f"doc {i} " + "word " * (i % 11)}) for i in range(60)]
DAY = 86400.0


def write_dataset(root: Path, name: str, shards: int = 3) -> Path:
    for i in range(shards):
        write_jsonl(root / name / f"part-{i}.jsonl", [f"{name}{r}" for r in ROWS[i::shards]])
    return root / name


def fresh(index_dir: Path, **kw: object) -> ShardCache:
    """A new process's cache on ``index_dir``."""
    return ShardCache(index=ShardIndex(IndexDir(str(index_dir))), **kw)  # type: ignore[arg-type]


def names(index_dir: Path, sub: str) -> set[str]:
    return {str(p.relative_to(index_dir)) for p in index_dir.glob(f"{sub}/**/*.z*")}


def resolve(index_dir: Path, path: Path, name: str = "d") -> tuple[ShardCache, list[str]]:
    """Resolve one dataset in a new process; its cache and the entry names of its shards."""
    cache = fresh(index_dir)
    (info,) = resolve_datasets([DatasetSpec(name, str(path), 1.0)], cache=cache)
    entries = [EntryKey(s.path, s.identity, s.format).name for s in info.shards]
    return cache, entries


def age(index_dir: Path, name: str, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(index_dir / name, (when, when))


def orphan(index_dir: Path, tag: str, seconds_ago: float) -> str:
    """An entry of a shard no catalog lists (a rewritten shard's old version)."""
    key = EntryKey(f"/gone/{tag}.jsonl", "size=9 mtime_ns=1", "jsonl")
    IndexDir(str(index_dir)).put_atomic(key.name, encode_entry(key, 1, {}))
    age(index_dir, key.name, seconds_ago)
    return key.name


@pytest.fixture
def three(tmp_path: Path) -> tuple[Path, dict[str, tuple[str, list[str]]]]:
    """Datasets a, b, c indexed in turn (a used longest ago), plus an old and a young orphan;
    returns the index directory and each dataset's (catalog, entries)."""
    index_dir = tmp_path / "index"
    out = {}
    for n, ago in (("a", 3 * DAY), ("b", 2 * DAY), ("c", DAY)):
        cache, entries = resolve(index_dir, write_dataset(tmp_path / "data", n))
        (catalog,) = cache.index.pinned()
        for name in (catalog, *entries):
            age(index_dir, name, ago)
        out[n] = (catalog, entries)
    out["old"] = ("", [orphan(index_dir, "old", 2 * 3600)])
    out["young"] = ("", [orphan(index_dir, "young", 60)])
    return index_dir, out


def test_orphans_go_first_then_least_recently_used_catalogs(three) -> None:
    index_dir, ds = three
    store = IndexDir(str(index_dir))
    usage = {b.name: b.size for b in store.blobs()}
    total = sum(usage.values())
    # Just over what it takes without the old orphan: only that orphan goes.
    report = prune(store, {}, max_bytes=total - usage[ds["old"][1][0]])
    assert report.orphans_removed == 1 and report.catalogs_removed == 0
    assert not (index_dir / ds["old"][1][0]).exists()
    assert (index_dir / ds["young"][1][0]).exists()  # younger than the grace period
    # One byte less: a, the least recently used catalog, goes with its entries; b and c stay.
    report = prune(store, {}, max_bytes=report.bytes_after - 1)
    assert (report.catalogs_removed, report.entries_removed) == (1, 3)
    assert report.bytes_after <= report.max_bytes
    left = names(index_dir, "catalogs") | names(index_dir, "entries")
    assert not {ds["a"][0], *ds["a"][1]} & left
    assert {ds["b"][0], *ds["b"][1], ds["c"][0], *ds["c"][1], *ds["young"][1]} <= left


def test_a_catalog_read_at_start_becomes_the_most_recently_used(three, tmp_path) -> None:
    index_dir, ds = three
    cache, _ = resolve(index_dir, tmp_path / "data" / "a")  # a warm start of a: a hit
    assert cache.stats()["catalog_hits"] == 1
    store = IndexDir(str(index_dir))
    catalogs = sum(b.size for b in store.blobs() if b.name.startswith("catalogs/"))
    entries_b = sum(b.size for b in store.blobs() if b.name in ds["b"][1])
    used = sum(b.size for b in store.blobs())
    report = prune(store, {}, max_bytes=used - entries_b - catalogs // 3)
    assert report.catalogs_removed == 1
    assert (index_dir / ds["a"][0]).exists() and not (index_dir / ds["b"][0]).exists()


def test_pinned_catalogs_and_their_entries_are_never_removed(three, tmp_path) -> None:
    index_dir, ds = three
    cache, entries = resolve(index_dir, tmp_path / "data" / "a")  # the running server: a
    report = prune(cache.index.store, cache.index.pinned(), max_bytes=0)
    left = names(index_dir, "catalogs") | names(index_dir, "entries")
    assert left == {ds["a"][0], *entries, *ds["young"][1]}
    assert report.over_budget and report.pinned_bytes > 0
    assert report.catalogs_removed == 2 and report.entries_removed == 6
    assert "removed 1 orphan(s), 2 least recently used catalog(s)" in report.summary()


def test_an_entry_shared_by_two_catalogs_stays_with_the_one_kept(tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    path = write_dataset(tmp_path / "data", "web")
    whole, entries = resolve(index_dir, path)
    part = fresh(index_dir)  # another listing of the same files: one of them
    resolve_datasets([DatasetSpec("one", str(path / "part-1.jsonl"), 1.0)], cache=part)
    (whole_catalog,) = whole.index.pinned()
    (part_catalog,) = part.index.pinned()
    age(index_dir, whole_catalog, DAY)  # the whole listing was used longest ago
    store = IndexDir(str(index_dir))
    size = {b.name: b.size for b in store.blobs()}
    unique = size[whole_catalog] + size[entries[0]] + size[entries[2]]
    report = prune(store, {}, max_bytes=sum(size.values()) - unique)
    assert (report.catalogs_removed, report.entries_removed) == (1, 2)
    assert names(index_dir, "entries") == {entries[1]}
    assert names(index_dir, "catalogs") == {part_catalog}


def test_a_reader_keeps_its_mapped_entry_and_rebuilds_a_removed_one(tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    path = write_dataset(tmp_path / "data", "web")
    reader = fresh(index_dir, max_open_indexes=1)
    (info,) = resolve_datasets([DatasetSpec("web", str(path), 1.0)], cache=reader)
    first, second = info.shards[0], info.shards[1]
    rows = list(range(first.num_rows))
    expected = reader.read_rows(first, rows, "text")  # first's entry is now mapped, open
    assert prune(IndexDir(str(index_dir)), {}, max_bytes=0).entries_removed == 3
    assert names(index_dir, "entries") == set()
    assert reader.read_rows(first, rows, "text") == expected  # the mapping stays readable
    builds = reader.stats()["index_builds"]
    reader.read_rows(second, [0], "text")  # closes first's entry (one open at most)
    assert reader.read_rows(first, rows, "text") == expected  # gone: rebuilt from the shard
    assert reader.stats()["index_builds"] == builds + 2
    assert len(names(index_dir, "entries")) == 2


READER = """
import sys
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.index_dir import IndexDir
from zephon_server.engine.shard_index import ShardIndex
from zephon_server.engine.shards import ShardCache

cache = ShardCache(index=ShardIndex(IndexDir(sys.argv[1])))
(info,) = resolve_datasets([DatasetSpec("web", sys.argv[2], 1.0)], cache=cache)
def rows():
    return [cache.read_rows(s, list(range(s.num_rows)), "text") for s in info.shards]
first = rows()
print("ready", flush=True)
sys.stdin.readline()  # the other process prunes the directory meanwhile
print("same" if rows() == first else "DIFFERENT", cache.stats()["index_builds"], flush=True)
"""


def test_a_start_that_wrote_enforces_the_budget_a_warm_start_prunes_nothing(
    tmp_path: Path,
) -> None:
    index_dir = tmp_path / "index"
    old = write_dataset(tmp_path / "data", "old")
    resolve(index_dir, old)
    new = write_dataset(tmp_path / "data", "new")
    pipe = Pipeline([DatasetSpec("new", str(new), 1.0)], lanes=2)
    pipe.tokenize(tokenizer="byte").batch(microbatch_size=2)
    execution = ExecutionConfig(runner="inline", index_dir=str(index_dir), index_max_bytes=0)
    plan = pipe.plan(execution)  # cold for "new": writes, then prunes "old"
    assert plan.index is not None and plan.index.max_bytes == 0
    kept = names(index_dir, "catalogs") | names(index_dir, "entries")
    assert len(kept) == 4 and all("old" not in n for n in kept)
    entries_new = {EntryKey(s.path, s.identity, s.format).name for s in plan.datasets[0].shards}
    assert names(index_dir, "entries") == entries_new
    resolve(index_dir, old)  # someone indexes "old" again
    pipe.plan(execution)  # a warm start of "new" writes nothing: it does not prune
    assert len(names(index_dir, "catalogs")) == 2


def test_enforce_warns_when_the_datasets_in_use_exceed_the_budget(tmp_path, caplog) -> None:
    index_dir = tmp_path / "index"
    cache, _ = resolve(index_dir, write_dataset(tmp_path / "data", "web"))
    cache.index.store.max_bytes = 1
    caplog.set_level("WARNING")
    report = enforce(cache.index)
    assert report is not None and report.over_budget and report.bytes_removed == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "more than its budget of 1 bytes; nothing they need is removed" in line
    assert "raise --index-max-bytes" in line
    assert enforce(ShardIndex(IndexDir(None))) is None  # memory only: nothing to bound


def test_default_budget_is_a_tenth_of_the_filesystem_capped(tmp_path: Path) -> None:
    fs = os.statvfs(tmp_path)
    expected = min(fs.f_blocks * fs.f_frsize // 10, 32 << 30)
    assert abs(max_bytes_of(IndexDir(str(tmp_path / "new" / "index"))) - expected) <= 1
    assert max_bytes_of(IndexDir(str(tmp_path), max_bytes=5)) == 5
    with pytest.raises(ValueError, match="index_max_bytes must be a number of bytes >= 0"):
        IndexDir(str(tmp_path), max_bytes=-1)


def test_yaml_keys_and_flags_for_the_budgets(tmp_path: Path) -> None:
    doc = {
        "datasets": [{"name": "d", "path": "x", "weight": 1}],
        "pipeline": [{"tokenize": {"tokenizer": "byte"}}, {"batch": {"microbatch_size": 2}}],
        "index_max_bytes": "10G",
        "spill_max_bytes": 4096,
    }
    _, execution = parse_config(doc, base_dir=str(tmp_path))
    assert (execution.index_max_bytes, execution.spill_max_bytes) == (10 << 30, 4096)
    with pytest.raises(ConfigError, match=r"index_max_bytes must be a number of bytes .*'lots'"):
        parse_config({**doc, "index_max_bytes": "lots"}, base_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="execution: index_max_bytes is a top-level key"):
        parse_config({**doc, "execution": {"index_max_bytes": 1}}, base_dir=str(tmp_path))
    import argparse

    args = argparse.Namespace(index_max_bytes="500M", spill_max_bytes=None)
    assert budgets_from_args(args) == {"index_max_bytes": 500 << 20}
    with pytest.raises(ZephonError, match="--spill-max-bytes must be a number of bytes"):
        budgets_from_args(argparse.Namespace(index_max_bytes=None, spill_max_bytes="-1"))
    assert byte_size("2GiB", "x") == 2 << 30


def test_zephon_index_prune_reports_what_it_removed(tmp_path: Path, capsys) -> None:
    index_dir = tmp_path / "index"
    resolve(index_dir, write_dataset(tmp_path / "data", "old"))
    orphan(index_dir, "x", 2 * 3600)
    write_dataset(tmp_path / "data", "web")
    config = tmp_path / "p.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "datasets": [{"name": "web", "path": "data/web", "weight": 1}],
                "pipeline": [
                    {"tokenize": {"tokenizer": "byte"}},
                    {"batch": {"microbatch_size": 2}},
                ],
            }
        )
    )
    base = ["index", "--config", str(config), "--index-dir", str(index_dir)]
    assert main([*base, "--progress-interval", "0"]) == 0  # builds web's index
    capsys.readouterr()
    # Under budget, --prune removes the old orphan only; the old dataset's catalog stays.
    assert main([*base, "--prune"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 orphan(s), 0 least recently used catalog(s)" in out
    # With a budget of 0, the old dataset goes; web's catalog and entries are kept.
    assert main([*base, "--prune", "--index-max-bytes", "0"]) == 0
    captured = capsys.readouterr()
    assert "removed 0 orphan(s), 1 least recently used catalog(s) and 3 of their entries" in (
        captured.out
    )
    assert "more than the budget of 0 bytes; raise --index-max-bytes" in captured.err
    assert len(names(index_dir, "entries")) == 3 and len(names(index_dir, "catalogs")) == 1
    web = tmp_path / "data" / "web"
    assert names(index_dir, "entries") == {
        EntryKey(str(web / f"part-{i}.jsonl"), *_identity_fmt(web / f"part-{i}.jsonl")).name
        for i in range(3)
    }


def test_two_prunes_at_once_the_second_skips(tmp_path: Path) -> None:
    import fcntl

    index_dir = tmp_path / "index"
    resolve(index_dir, write_dataset(tmp_path / "data", "web"))
    fd = os.open(index_dir / ".prune.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        report = prune(IndexDir(str(index_dir)), {}, max_bytes=0)
        assert report.skipped and not report.over_budget and "skipped" in report.summary()
        assert len(names(index_dir, "entries")) == 3
    finally:
        os.close(fd)


def _identity_fmt(path: Path) -> tuple[str, str]:
    from zephon_server.engine.identity import local_identity

    st = path.stat()
    return local_identity(st.st_size, st.st_mtime_ns), "jsonl"


def test_the_spill_budget_holds_without_an_index_directory(tmp_path: Path) -> None:
    """``index_dir: none`` puts spill files in a temporary directory: the budget given still
    bounds them, in the planning process and in every operator's context (a worker's)."""
    write_dataset(tmp_path / "data", "web")
    doc = {
        "datasets": [{"name": "web", "path": str(tmp_path / "data" / "web"), "weight": 1}],
        "pipeline": [{"tokenize": {"tokenizer": "byte"}}, {"batch": {"microbatch_size": 2}}],
        "index_dir": "none",
        "spill_max_bytes": 12345,
    }
    pipe, execution = parse_config(doc, base_dir=str(tmp_path))
    store = cache_for(None).index.store  # the process's memory-only index
    try:
        plan = pipe.plan(execution)
        assert plan.index is None
        assert cache_for(None).spill.budget() == 12345  # the planning process's cache
        store.spill_max_bytes = None  # a worker process's, before its operators' setup
        context = pickle.loads(pickle.dumps(plan.context(plan.ops[0], 0)))  # as a worker's
        assert context.shard_cache.spill.budget() == 12345
    finally:
        store.spill_max_bytes = None  # the other tests of this process: the default
