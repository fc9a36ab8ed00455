"""Property: any sequence of cuts and resumes, on any runner, equals the uninterrupted stream.

Hypothesis draws the data-shaping settings (chunk size, sentinel cadence, lanes), the cut
points of several successive resumes, and the runner and worker count of each segment.
Minimised failures found while developing are pinned with ``@example``.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline

_SPECS: list = []


@pytest.fixture(scope="module", autouse=True)
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("prop-corpus")
    write_sample_corpus(root, docs_per_dataset=20, seed=5, mean_words=25)
    _SPECS[:] = sample_corpus_specs(root)


def build(chunk_size, k, lanes, algorithm):
    pipe = Pipeline(_SPECS, seed=3, lanes=lanes, chunk_size=chunk_size, flush_every_k_chunks=k)
    pipe.decode_text().tokenize(tokenizer="byte").ensure_mixture(buffer_size=8)
    pipe.pack_flat(max_length=64, algorithm="first_fit")
    pipe.shuffle(buffer_size=5, algorithm=algorithm, warmup_size=2)
    return pipe.batch(microbatch_size=2)


def consume(run, take):
    """Up to ``take`` batches per lane (all when None); returns {lane: [chain]}."""
    out: dict[int, list] = {lane: [] for lane in run.lanes}
    for item in run:
        if isinstance(item, NumberedBatch) and (take is None or len(out[item.lane_id]) < take):
            out[item.lane_id].append(item.chain_digest)
            if take is not None and all(len(v) >= take for v in out.values()):
                break
    return out


segment = st.tuples(st.integers(0, 4), st.sampled_from(["inline", "threads"]), st.integers(1, 3))
