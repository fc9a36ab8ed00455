"""The replay cache's byte budget: never exceeded, oldest chunks evicted first, a full disk
pauses writing with one warning, the reserve stays free, writers in several processes share
one ledger, and the data never changes (a tiny budget streams and resumes exactly)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.support.builders import lane_chains
from zephon_server.engine.cache_budget import LEDGER_NAME, CacheBudget, tree_usage
from zephon_server.engine.checkpoint import ResumeState
from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.replay_cache import ReplayCache
from zephon_server.service.metrics import ReplayCacheCollector

KIB = 1024
FINGERPRINT = "ab" * 32


def records(lane: int, chunk: int, docs: int = 4, tokens: int = 700):
    """Tokenized records of one lane's chunk, as ``ReplayCache.store`` sees them."""
    recs = [
        SimpleNamespace(meta=SimpleNamespace(lane_id=lane, cursor=(chunk, i, 0)))
        for i in range(docs)
    ]
    ids = [np.arange(tokens, dtype=np.int32) + i for i in range(docs)]
    return recs, ids


def bound(root: Path, budget: CacheBudget, fingerprint: str = FINGERPRINT) -> ReplayCache:
    return ReplayCache(root, budget=budget).bind(fingerprint)


def on_disk(cache: ReplayCache) -> int:
    return tree_usage(cache.root, cache.budget, skip=LEDGER_NAME)


def chunks_kept(cache: ReplayCache) -> dict[int, list[int]]:
    out = {}
    for lane_dir in sorted(cache.directory.glob("lane-*")):
        out[int(lane_dir.name[5:])] = sorted(int(p.name[6:]) for p in lane_dir.iterdir())
    return out


def test_the_budget_is_never_exceeded_and_the_oldest_chunks_go_first(tmp_path):
    budget = CacheBudget(max_bytes=96 * KIB, reserve_bytes=0, block=4096)
    cache = bound(tmp_path, budget)
    for chunk in range(30):
        for lane in range(3):
            cache.store(1, *records(lane, chunk))
            used = on_disk(cache)
            assert used <= budget.max_bytes, (chunk, lane, used)
            assert cache.usage().bytes == used  # the ledger is the truth
    kept = chunks_kept(cache)
    assert all(29 in chunks for chunks in kept.values()), kept  # the newest entry of each lane
    oldest_kept = min(min(chunks) for chunks in kept.values() if chunks)
    assert oldest_kept >= 20, kept  # eviction took the oldest chunks of every lane
    counts = cache.usage()
    assert counts.evicted_bytes > 0 and counts.skipped_budget == 0
    assert cache.stored == 30 * 3 * 4


def test_an_entry_larger_than_the_budget_is_not_written(tmp_path):
    budget = CacheBudget(max_bytes=8 * KIB, reserve_bytes=0, block=4096)
    cache = bound(tmp_path, budget)
    cache.store(1, *records(0, 0, docs=8, tokens=2000))  # ~32 KB: never fits
    assert not list(tmp_path.rglob("*.tok"))
    assert cache.usage().skipped_budget == 1
    assert cache.stored == 0
    assert on_disk(cache) <= budget.max_bytes


def test_other_pipelines_directories_are_evicted_first(tmp_path):
    # an entry takes 12 KiB (two blocks and its chunk directory)
    budget = CacheBudget(max_bytes=96 * KIB, reserve_bytes=0, block=4096)
    old = bound(tmp_path, budget, fingerprint="cd" * 32)
    for chunk in range(4):
        old.store(1, *records(0, chunk))
    assert old.directory.exists()
    cache = bound(tmp_path, budget)
    for chunk in range(6):
        cache.store(1, *records(0, chunk))
    assert not old.directory.exists()  # the other pipeline's cache made room
    assert chunks_kept(cache) == {0: list(range(6))}  # none of this pipeline's entries went
    assert on_disk(cache) <= budget.max_bytes


def test_binding_recounts_a_drifted_ledger_and_removes_stray_temp_files(tmp_path):
    budget = CacheBudget(max_bytes=1 << 20, reserve_bytes=0, block=4096)
    cache = bound(tmp_path, budget)
    for chunk in range(5):
        cache.store(1, *records(0, chunk))
    stray = cache.directory / "lane-0000" / "chunk-00000004" / ".op1-4_0_0.tok.99.1.tmp"
    stray.write_bytes(b"x" * 5000)  # a writer killed mid-write
    for name in ("chunk-00000000", "chunk-00000001"):
        for f in (cache.directory / "lane-0000" / name).iterdir():
            f.unlink()
        (cache.directory / "lane-0000" / name).rmdir()  # deleted by hand
    assert cache.usage().bytes != on_disk(cache)
    again = ReplayCache(tmp_path, budget=budget).bind(FINGERPRINT)
    assert not stray.exists()
    assert again.usage().bytes == on_disk(again)


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget-corpus")
    write_sample_corpus(root, docs_per_dataset=60, seed=5, mean_words=30)
    return sample_corpus_specs(root)


def pipeline(specs):
    pipe = Pipeline(specs, seed=7, lanes=2, chunk_size=8, flush_every_k_chunks=4)
    pipe.decode_text().tokenize(tokenizer="byte")
    pipe.pack_flat(max_length=256)
    pipe.shuffle(buffer_size=6)
    return pipe.batch(microbatch_size=2)


def test_a_tiny_budget_never_changes_the_data_nor_a_resume(specs, tmp_path):
    pipe = pipeline(specs)
    full = lane_chains(pipe.run(ExecutionConfig(runner="inline")))
    budget = CacheBudget(max_bytes=24 * KIB, reserve_bytes=0, block=4096)
    run = pipe.run(
        ExecutionConfig(runner="threads", workers=2),
        replay_cache=ReplayCache(tmp_path, budget=budget),
    )
    cut = 13
    head = lane_chains(run, limit=cut)  # every lane reaches cut (some go further)
    assert head == {lane: v[: len(head[lane])] for lane, v in full.items()}
    state = ResumeState.decode(run.checkpoint({lane: cut for lane in run.lanes}).encode())
    assert on_disk(run.replay_cache) <= budget.max_bytes
    assert run.replay_cache.usage().evicted_bytes > 0  # the budget was tight
    resumed = pipe.run(
        ExecutionConfig(runner="threads", workers=2),
        resume=state,
        replay_cache=ReplayCache(tmp_path, budget=budget),
    )
    assert lane_chains(resumed) == {lane: v[cut:] for lane, v in full.items()}
    assert on_disk(resumed.replay_cache) <= budget.max_bytes


def test_the_ledger_is_on_metrics(tmp_path):
    budget = CacheBudget(max_bytes=24 * KIB, reserve_bytes=0, block=4096)
    cache = bound(tmp_path, budget)
    cache.store(1, *records(0, 0, docs=1, tokens=100))
    cache.store(1, *records(0, 1, docs=8, tokens=2000))  # too big
    registry = CollectorRegistry()
    registry.register(ReplayCacheCollector(cache))
    value = registry.get_sample_value
    assert value("zephon_replay_cache_bytes") == on_disk(cache) > 0
    assert value("zephon_replay_cache_budget_bytes") == 24 * KIB
    assert value("zephon_replay_cache_writes_skipped_total", {"reason": "budget"}) == 1
    assert value("zephon_replay_cache_writes_skipped_total", {"reason": "disk_full"}) == 0
    assert value("zephon_replay_cache_evicted_bytes_total") == 0
