"""Shared fixtures: a small real corpus (JSONL, JSONL.zst, Parquet) made per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon_server.engine.corpus import write_sample_corpus
from zephon_server.engine.pipeline import Pipeline


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(root, docs_per_dataset=150, seed=7)
    return root


@pytest.fixture(scope="session")
def corpus_specs(corpus_dir):
    from zephon_server.engine.corpus import sample_corpus_specs

    return sample_corpus_specs(corpus_dir)


def make_pipeline(specs, *, lanes=4, chunk_size=32, k=2, seed=1234, ops=None) -> Pipeline:
    """A pipeline over the corpus; ``ops`` is a list of (name, params) appended before batch."""
    pipe = Pipeline(specs, seed=seed, lanes=lanes, chunk_size=chunk_size, flush_every_k_chunks=k)
    pipe.decode_text().tokenize(tokenizer="byte")
    for name, params in ops or []:
        pipe.add(name, **params)
    return pipe
