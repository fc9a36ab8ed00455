"""The replay cache: a resume reads cached token ids instead of tokenizing, same data."""

from __future__ import annotations

import logging

import pytest

from tests.support.builders import lane_chains
from zephon_server.engine.checkpoint import ResumeState
from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.replay_cache import ReplayCache
from zephon_server.engine.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay-cache-corpus")
    write_sample_corpus(root, docs_per_dataset=60, seed=5, mean_words=30)
    return sample_corpus_specs(root)


def pipeline(specs, *, k=4):
    pipe = Pipeline(specs, seed=7, lanes=2, chunk_size=8, flush_every_k_chunks=k)
    pipe.decode_text().tokenize(tokenizer="byte")
    pipe.pack_flat(max_length=256)
    pipe.shuffle(buffer_size=6)
    return pipe.batch(microbatch_size=2)


chains = lane_chains


@pytest.fixture
def encoded_texts(monkeypatch):
    """Counts the texts the byte tokenizer encodes (inline and threads runners)."""
    counter = {"texts": 0}
    original = ByteTokenizer.encode_batch

    def counting(self, texts, **kwargs):
        counter["texts"] += len(texts)
        return original(self, texts, **kwargs)

    monkeypatch.setattr(ByteTokenizer, "encode_batch", counting)
    return counter


def checkpoint_mid_epoch(pipe, cache, cut):
    """A run with ``cache`` consumed for ``cut`` batches per lane, then checkpointed."""
    run = pipe.run(ExecutionConfig(runner="inline"), replay_cache=cache)
    chains(run, limit=cut)
    return ResumeState.decode(run.checkpoint({lane: cut for lane in run.lanes}).encode())


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_resume_reads_the_cache_instead_of_tokenizing(specs, tmp_path, encoded_texts, runner):
    pipe = pipeline(specs)
    full = chains(pipe.run(ExecutionConfig(runner="inline")))
    cut = 13
    state = checkpoint_mid_epoch(pipe, ReplayCache(tmp_path), cut)
    assert any(ls.replay_cursor[0] % 4 for ls in state.lanes.values()), "cut is not mid-epoch"

    encoded_texts["texts"] = 0
    plain = pipe.run(ExecutionConfig(runner=runner, workers=2), resume=state)
    assert chains(plain) == {lane: v[cut:] for lane, v in full.items()}
    without_cache = encoded_texts["texts"]

    encoded_texts["texts"] = 0
    run = pipe.run(
        ExecutionConfig(runner=runner, workers=2), resume=state, replay_cache=ReplayCache(tmp_path)
    )
    assert chains(run) == {lane: v[cut:] for lane, v in full.items()}
    with_cache = encoded_texts["texts"]
    hits = run.replay_cache.hits
    # Every replayed document the first run cached came from the cache: a lane replays from its
    # boundary to the end of its cursor's epoch (the shuffle may emit the cursor's row late),
    # so at least every chunk up to the cursor's, 8 documents each.
    cached = {(int(d.parent.name[5:]), int(d.name[6:])) for d in tmp_path.rglob("chunk-*")}
    replayed_docs = sum(
        8
        for lane, ls in state.lanes.items()
        for chunk in range(ls.boundary_chunk, run.replay_ends[lane])
        if (lane, chunk) in cached
    )
    assert replayed_docs >= sum(
        (ls.replay_cursor[0] - ls.boundary_chunk + 1) * 8 for ls in state.lanes.values()
    )
    assert hits == replayed_docs
    assert with_cache == without_cache - hits
    assert run.stats()["replay_cache"]["hits"] == hits


def test_corrupt_or_missing_entries_are_tokenized_again(specs, tmp_path, caplog):
    pipe = pipeline(specs)
    full = chains(pipe.run(ExecutionConfig(runner="inline")))
    cut = 13
    state = checkpoint_mid_epoch(pipe, ReplayCache(tmp_path), cut)
    files = sorted(tmp_path.rglob("*.tok"))
    assert files
    damaged = files[0]
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    files[1].unlink()
    (files[2].parent / "junk.tok").write_bytes(b"not a cache file")

    caplog.set_level(logging.WARNING, "zephon_server.engine.replay_cache")
    run = pipe.run(
        ExecutionConfig(runner="inline"), resume=state, replay_cache=ReplayCache(tmp_path)
    )
    assert chains(run) == {lane: v[cut:] for lane, v in full.items()}
    assert run.replay_cache.misses > 0
    assert "checksum mismatch" in caplog.text


def test_a_different_pipeline_never_reads_the_cache(specs, tmp_path):
    pipe = pipeline(specs)
    state = checkpoint_mid_epoch(pipe, ReplayCache(tmp_path), 5)
    first = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())  # not the byte ledger
    other = Pipeline(specs, seed=8, lanes=2, chunk_size=8, flush_every_k_chunks=4)
    other.decode_text().tokenize(tokenizer="byte")
    other.pack_flat(max_length=256)
    other.shuffle(buffer_size=6)
    other = other.batch(microbatch_size=2)
    other_state = checkpoint_mid_epoch(other, ReplayCache(tmp_path), 5)
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2  # one per fingerprint
    assert state.fingerprint != other_state.fingerprint
    assert first[0] == state.fingerprint[:16]


def test_old_epochs_are_evicted(specs, tmp_path):
    pipe = pipeline(specs, k=2)
    run = pipe.run(
        ExecutionConfig(runner="inline"), replay_cache=ReplayCache(tmp_path, keep_epochs=1)
    )
    chains(run)
    directory = run.replay_cache.directory
    for lane_dir in directory.iterdir():
        chunks = sorted(int(p.name[6:]) for p in lane_dir.iterdir())
        last_epoch = (max(chunks) // 2) * 2
        # only the last epoch is kept (the lane evicts when it starts a new one)
        assert min(chunks) >= last_epoch - 2, chunks
        assert len(chunks) <= 4
