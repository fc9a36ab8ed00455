"""Tokenizers: a BPE tokenizer trained on the spot and the byte tokenizer, BOS/EOS placement,
and a BPE pipeline giving the same stream on every runner."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer as RawTokenizer

from zephon_server.engine.corpus import generate_code, generate_texts
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.tokenizer import ByteTokenizer, load_tokenizer, train_bpe_tokenizer

TEXTS = ["Hello world.", "", "naïve café — ünïcode ✓", "tabs\tand\nnewlines  ", "x" * 300]


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory):
    texts = generate_texts(300, seed=1) + generate_code(100, seed=2)
    return str(train_bpe_tokenizer(texts, tmp_path_factory.mktemp("bpe") / "tok.json", 512))


def test_bpe_ids_match_the_tokenizers_library_with_offsets(bpe_path):
    raw = RawTokenizer.from_file(bpe_path)
    expected = [e.ids for e in raw.encode_batch(TEXTS, add_special_tokens=False)]
    got = load_tokenizer(bpe_path).encode_batch(TEXTS)
    assert [a.tolist() for a in got] == expected
    assert all(a.dtype == np.int32 for a in got)


@pytest.mark.parametrize("kind", ["bpe", "byte"])
def test_prefix_and_suffix_surround_each_text(bpe_path, kind):
    tok = load_tokenizer(bpe_path) if kind == "bpe" else ByteTokenizer()
    plain = tok.encode_batch(TEXTS)
    for prefix, suffix in [((), (7,)), ((5,), ()), ((5, 6), (7, 8)), ((), ())]:
        got = tok.encode_batch(TEXTS, prefix=prefix, suffix=suffix)
        assert [a.tolist() for a in got] == [[*prefix, *p.tolist(), *suffix] for p in plain]
        assert all(a.dtype == np.int32 for a in got)


def bpe_pipeline(specs, tokenizer):
    pipe = Pipeline(specs, seed=3, lanes=4, chunk_size=16, flush_every_k_chunks=2)
    pipe.decode_text().tokenize(tokenizer=tokenizer, add_bos=True)
    pipe.pack_flat(max_length=128)
    pipe.shuffle(buffer_size=8)
    return pipe.batch(microbatch_size=4)


def test_bos_starts_every_document_in_the_packed_rows(corpus_specs, bpe_path):
    tok = load_tokenizer(bpe_path)
    run = bpe_pipeline(corpus_specs, bpe_path).run(ExecutionConfig(runner="inline"))
    batches = [b for _, b in zip(range(6), run.batches())]
    run.close()
    starts = ends = 0
    for batch in batches:
        for row, meta in zip(batch.tensors["input_ids"], batch.rows):
            offset = 0
            for span in meta.spans:
                if span.start == 0:  # the piece holds its document's first token
                    assert row[offset] == tok.bos_id, (meta, offset)
                    starts += 1
                ends += int(row[offset + span.length - 1] == tok.eos_id)
                offset += span.length
    assert starts > 10 and ends > 0
