"""Packing's trainer tensors: ``labels``, ``cu_seqlens``/``num_docs``/``max_seqlen``, the
``max_docs_per_row`` packing limit, batching them, and a YAML pipeline across runners.

The tests of the same topic that need a subprocess, worker processes, a socket or a real
file system limit are in ``tests/service/test_trainer_tensors.py``.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.builders import run_op, tokenized_stream
from tests.unit.test_pack import (
    ALGORITHMS,
    OPS,
    check_packed,
    interleave,
    output_digest,
    records_of,
)
from zephon_server.engine.config import load_config
from zephon_server.engine.errors import ConfigError, ContractError, WorkerError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.batch import Batch
from zephon_server.engine.ops.pack import PackFlat, PackSequences
from zephon_server.engine.ops.trainer_tensors import ROW_TENSORS, next_token_labels
from zephon_server.engine.records import SampleBatch, SampleRecord

IGNORE = -100
TRAINER = {"emit_labels": True, "emit_cu_seqlens": True}


def masked(records, seed=0, *, density=0.6):
    """The records with a random uint8 ``loss_mask`` (``density`` of the tokens trained)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in records:
        n = len(r.payload["input_ids"])
        mask = (rng.random(n) < density).astype(np.uint8)
        out.append(r.with_payload({**r.payload, "loss_mask": mask}))
    return out


def rows_of(out):
    return [e for e in records_of(out) if not e.meta.tombstone]


def without_trainer_tensors(out):
    """The output with the per-row tensors removed (check_packed knows token-aligned ones)."""
    drop = ROW_TENSORS
    return [
        e
        if e.meta.tombstone
        else SampleRecord({k: v for k, v in e.payload.items() if k not in drop}, e.meta)
        for e in records_of(out)
    ]


def expected_labels(row, sources, width):
    """Labels of a row recomputed from its spans and the source documents (not its segments)."""
    want = np.full(width, IGNORE, dtype=np.int64)
    offset = 0
    for span in row.meta.spans:
        src = sources[(row.meta.lane_id, span.doc)].payload
        ids, mask = src["input_ids"], src.get("loss_mask")
        for k in range(span.length - 1):
            target = span.start + k + 1
            if mask is None or mask[target]:
                want[offset + k] = ids[target]
        offset += span.length
    return want


def check_trainer_tensors(op, inputs, out, max_docs):
    """Labels from spans and from segments agree; cu_seqlens agrees with the segments."""
    sources = {(r.meta.lane_id, r.meta.doc): r for r in inputs}
    rows = rows_of(out)
    for row in rows:
        p = row.payload
        width = len(p["input_ids"])
        labels = p["labels"]
        assert labels.dtype == np.int32 and labels.shape == (width,)
        np.testing.assert_array_equal(labels, expected_labels(row, sources, width))
        np.testing.assert_array_equal(
            labels, next_token_labels(p["input_ids"], p["segment_ids"], p.get("loss_mask"), IGNORE)
        )
        seg = p["segment_ids"]
        used = int((seg != 0).sum())
        num_docs = int(p["num_docs"])
        cu = p["cu_seqlens"]
        assert cu.dtype == p["num_docs"].dtype == p["max_seqlen"].dtype == np.int32
        assert cu.shape == (max_docs + 1,) and p["num_docs"].shape == p["max_seqlen"].shape == ()
        assert 1 <= num_docs <= max_docs and num_docs == seg.max() == len(row.meta.spans)
        lengths = np.diff(cu[: num_docs + 1])
        np.testing.assert_array_equal(lengths, np.bincount(seg, minlength=num_docs + 1)[1:])
        assert cu[0] == 0 and (cu[num_docs:] == used).all()
        assert int(p["max_seqlen"]) == lengths.max()
        if isinstance(op, PackFlat):
            assert used == int(p["padding_mask"].sum())
        if op.algorithm != "wrap":  # positions restart at every cu_seqlens boundary
            for k in range(num_docs):
                np.testing.assert_array_equal(
                    p["positions"][cu[k] : cu[k + 1]], np.arange(lengths[k])
                )
    return rows


# -- labels ----------------------------------------------------------------------------------


def test_labels_by_hand():
    ids = np.array([10, 11, 12, 20, 21, 0, 0], dtype=np.int32)
    seg = np.array([1, 1, 1, 2, 2, 0, 0], dtype=np.int32)
    mask = np.array([0, 1, 0, 1, 1, 0, 0], dtype=np.uint8)
    got = next_token_labels(ids, seg, mask, -100)
    assert got.tolist() == [11, -100, -100, 21, -100, -100, -100]
    # without a loss mask every target inside a document is trained (pretraining text)
    assert next_token_labels(ids, seg, None, -1).tolist() == [11, 12, -1, 21, -1, -1, -1]


@settings(max_examples=40, deadline=None)
@given(
    op_index=st.integers(0, 1),
    algorithm=st.sampled_from(ALGORITHMS),
    max_length=st.integers(4, 48),
    max_docs=st.integers(1, 6),
    max_tokens=st.integers(1, 80),
    density=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_labels_and_cu_seqlens_property(
    op_index, algorithm, max_length, max_docs, max_tokens, density, seed
):
    inputs = masked(
        interleave(
            tokenized_stream(0, 20, seed=seed, max_tokens=max_tokens),
            tokenized_stream(1, 12, seed=seed + 1, max_tokens=max_tokens),
        ),
        seed,
        density=density,
    )
    op = OPS[op_index](
        max_length=max_length, algorithm=algorithm, max_docs_per_row=max_docs, **TRAINER
    )
    out = run_op(op, inputs)
    check_packed(op, inputs, without_trainer_tensors(out))  # every token once, in order
    rows = check_trainer_tensors(op, inputs, out, max_docs)
    assert rows


@pytest.mark.parametrize("op_cls", OPS)
def test_rows_without_loss_mask_train_every_inner_target(op_cls):
    inputs = interleave(tokenized_stream(0, 40, seed=3), tokenized_stream(1, 40, seed=4))
    op = op_cls(max_length=32, algorithm="wrap", max_docs_per_row=4, **TRAINER)
    out = run_op(op, inputs)
    rows = check_trainer_tensors(op, inputs, out, 4)
    # a wrapped document continues in the next row: its piece's last position has no target
    cut = [r for r in rows if r.meta.spans[-1].start + r.meta.spans[-1].length < 40]
    assert cut
    for row in rows:
        labels, seg = row.payload["labels"], row.payload["segment_ids"]
        ends = np.flatnonzero(np.diff(np.append(seg, 0)) != 0)  # last position of each piece
        assert (labels[ends] == IGNORE).all()
        assert (labels[seg != 0] != IGNORE).sum() == (seg != 0).sum() - len(ends)


def test_input_labels_with_emit_labels_is_a_contract_error():
    inputs = tokenized_stream(0, 5, seed=1)
    inputs = [r.with_payload({**r.payload, "labels": r.payload["input_ids"]}) for r in inputs]
    with pytest.raises((ContractError, WorkerError), match="already carry 'labels'"):
        run_op(PackFlat(max_length=16, emit_labels=True), inputs)
    # without emit_labels the input labels are carried as before
    out = run_op(PackFlat(max_length=16), inputs)
    assert all("labels" in r.payload for r in rows_of(out))


# -- max_docs_per_row ------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op_cls", OPS)
def test_max_docs_per_row_limits_the_packing(op_cls, algorithm):
    inputs = interleave(
        tokenized_stream(0, 60, seed=5, max_tokens=6), tokenized_stream(1, 60, seed=6)
    )
    free = rows_of(run_op(op_cls(max_length=64, algorithm=algorithm), inputs))
    assert max(len(r.meta.spans) for r in free) > 2  # the limit below binds
    op = op_cls(max_length=64, algorithm=algorithm, max_docs_per_row=2)
    out = run_op(op, inputs)
    check_packed(op, inputs, out)
    assert max(len(r.meta.spans) for r in rows_of(out)) == 2
    assert int(max(r.payload["segment_ids"].max() for r in rows_of(out))) == 2


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op_cls", OPS)
def test_a_limit_that_never_binds_changes_nothing(op_cls, algorithm):
    inputs = masked(interleave(tokenized_stream(0, 50, seed=2), tokenized_stream(1, 50, seed=3)))
    plain = run_op(op_cls(max_length=40, algorithm=algorithm), inputs)
    # every piece has >= 1 token, so a row never holds more than max_length pieces
    limited = run_op(op_cls(max_length=40, algorithm=algorithm, max_docs_per_row=40), inputs)
    assert output_digest(limited) == output_digest(plain)
    emitting = run_op(
        op_cls(max_length=40, algorithm=algorithm, max_docs_per_row=40, **TRAINER), inputs
    )
    stripped = [
        e
        if e.meta.tombstone
        else SampleRecord({k: v for k, v in e.payload.items() if k != "labels"}, e.meta)
        for e in without_trainer_tensors(emitting)
    ]
    assert output_digest(stripped) == output_digest(plain)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="emit_cu_seqlens needs max_docs_per_row"):
        PackFlat(max_length=8, emit_cu_seqlens=True)
    with pytest.raises(ConfigError, match=r"max_docs_per_row must be an integer >= 1, got 0"):
        PackSequences(max_length=8, max_docs_per_row=0)
    with pytest.raises(ConfigError, match=r"ignore_index must be a negative integer.*got 5"):
        PackFlat(max_length=8, emit_labels=True, ignore_index=5)
    with pytest.raises(ConfigError, match="emit_labels must be true or false"):
        PackFlat(max_length=8, emit_labels="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pack_sequences: ignore_index -1 needs pack_flat"):
        PackSequences(max_length=8, emit_labels=True, ignore_index=-1)
    with pytest.raises(ConfigError, match=r"ignore_index -1 does nothing without emit_labels"):
        PackSequences(max_length=8, ignore_index=-1)
    PackFlat(max_length=8, ignore_index=-100)  # the default, said aloud: harmless


def test_params_only_name_options_that_are_set():
    assert "emit_labels" not in PackFlat(max_length=8).params()
    op = PackFlat(max_length=8, max_docs_per_row=3, emit_cu_seqlens=True, emit_labels=True)
    assert {
        "emit_labels": True,
        "ignore_index": -100,
        "emit_cu_seqlens": True,
        "max_docs_per_row": 3,
    }.items() <= op.params().items()
    assert op.output_tensors() == (
        "input_ids",
        "positions",
        "segment_ids",
        "labels",
        "cu_seqlens",
        "num_docs",
        "max_seqlen",
        "padding_mask",
    )


def test_getinfo_tensor_names_list_the_trainer_tensors():
    from zephon_server.service.servicer import _tensor_names

    ops = [PackSequences(max_length=8, emit_labels=True, emit_cu_seqlens=True, max_docs_per_row=2)]
    hub = SimpleNamespace(plan=SimpleNamespace(ops=ops))
    names = _tensor_names(hub)  # type: ignore[arg-type]
    assert {"labels", "cu_seqlens", "num_docs", "max_seqlen", "segment_ids"} <= set(names)


# -- batching -------------------------------------------------------------------------------


def test_batch_stacks_per_row_tensors_of_unpadded_rows():
    inputs = masked(tokenized_stream(0, 40, seed=9))
    rows = rows_of(run_op(PackSequences(max_length=30, max_docs_per_row=3, **TRAINER), inputs))
    assert len({len(r.payload["input_ids"]) for r in rows[:4]}) > 1  # rows of unequal length
    (batch,) = run_op(Batch(microbatch_size=4), rows[:4])
    assert isinstance(batch, SampleBatch)
    t = batch.tensors
    width = max(len(r.payload["input_ids"]) for r in rows[:4])
    assert t["input_ids"].shape == t["labels"].shape == (4, width)
    assert t["cu_seqlens"].shape == (4, 4) and t["cu_seqlens"].dtype == np.int32
    assert t["num_docs"].shape == t["max_seqlen"].shape == (4,)
    for i, r in enumerate(rows[:4]):
        n = len(r.payload["input_ids"])
        np.testing.assert_array_equal(t["cu_seqlens"][i], r.payload["cu_seqlens"])
        assert (t["labels"][i, n:] == IGNORE).all()  # batch padding is ignored too
        assert t["cu_seqlens"][i, t["num_docs"][i]] == t["padding_mask"][i].sum() == n


def test_batch_refuses_per_row_tensors_of_different_shapes():
    inputs = tokenized_stream(0, 20, seed=9)
    rows = rows_of(run_op(PackFlat(max_length=30, max_docs_per_row=3, **TRAINER), inputs))
    bad = rows[1].with_payload({**rows[1].payload, "cu_seqlens": np.zeros(7, dtype=np.int32)})
    with pytest.raises((ContractError, WorkerError), match="'cu_seqlens' has different shapes"):
        run_op(Batch(microbatch_size=2), [rows[0], bad])


# -- goldens ---------------------------------------------------------------------------------

# Digests of the rows (cursors and every tensor) with labels and cu_seqlens on, computed once
# from this implementation; changing one changes what trainers receive (note it in the commit).
GOLDEN = {
    (
        "pack_sequences",
        "first_fit",
    ): "9461c1e557c19015b03878649bbdc3ec8abda32973d5003d465a4ac431af3e94",
    (
        "pack_sequences",
        "best_fit",
    ): "acb9574a88338a7acc7e942cb28767ec3127d21048917b53ae4ec25073778117",
    ("pack_sequences", "wrap"): "7f7f512a7ce2432d4558cbbddc984a856e5f40a00d7f99d3ef3d42dfa9ca8029",
    ("pack_flat", "first_fit"): "c393c7389f496154cf56812da6d910b060ac5276efc09af42527bb3089a011cc",
    ("pack_flat", "best_fit"): "1d45871f1db090a2cd2c9eb7b25c67310c97a2d82f3d09b825e4b122aee254db",
    ("pack_flat", "wrap"): "ed81073388ee6c78c1d0b2e8689fa4c4284e136228265a4e8529209e12d081fe",
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op_cls", OPS)
def test_golden(op_cls, algorithm):
    inputs = masked(
        interleave(tokenized_stream(0, 48, seed=7, max_tokens=50), tokenized_stream(1, 48, seed=7)),
        seed=7,
    )
    op = op_cls(max_length=40, algorithm=algorithm, max_open_bins=4, max_docs_per_row=3, **TRAINER)
    assert output_digest(run_op(op, inputs)) == GOLDEN[(op.op_name, algorithm)]


# -- a YAML pipeline across runners -------------------------------------------------------------


def write_pipeline(path, corpus_dir):
    cfg = {
        "seed": 11,
        "lanes": 2,
        "chunk_size": 16,
        "flush_every_k_chunks": 2,
        "datasets": [
            {"name": "web", "path": str(corpus_dir / "web"), "weight": 0.6},
            {"name": "books", "path": str(corpus_dir / "books"), "weight": 0.4},
        ],
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": "byte", "add_eos": True}},
            {"map_transform": {"fn": "tests.support.loss_masks:completion_mask"}},
            {"ensure_mixture": {"by": "loss_tokens", "buffer_size": 32}},
            {
                "pack_flat": {
                    "max_length": 256,
                    "emit_labels": True,
                    "ignore_index": -100,
                    "emit_cu_seqlens": True,
                    "max_docs_per_row": 4,
                }
            },
            {"shuffle": {"buffer_size": 8}},
            {"batch": {"microbatch_size": 4}},
        ],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_chains(path, execution):
    pipe, _ = load_config(path)
    chains: dict[int, list[str]] = defaultdict(list)
    tensors = []
    for batch in pipe.run(execution).batches():
        chains[batch.lane_id].append(batch.chain_digest.hex())
        if len(tensors) < 8:
            tensors.append(batch.tensors)
    return dict(chains), tensors


@pytest.fixture(scope="module")
def yaml_oracle(tmp_path_factory, corpus_dir):
    path = write_pipeline(tmp_path_factory.mktemp("trainer") / "pipeline.yaml", corpus_dir)
    return path, run_chains(path, ExecutionConfig(runner="inline"))


def test_yaml_pipeline_batches_carry_the_trainer_tensors(yaml_oracle):
    _, (chains, tensors) = yaml_oracle
    assert sorted(chains) == [0, 1] and all(len(v) > 3 for v in chains.values())
    for t in tensors:
        ids, seg = t["input_ids"], t["segment_ids"]
        assert t["labels"].shape == ids.shape and t["cu_seqlens"].shape == (4, 5)
        assert (t["num_docs"] <= 4).all() and (t["num_docs"] == seg.max(axis=1)).all()
        for i in range(len(ids)):
            want = next_token_labels(ids[i], seg[i], t["loss_mask"][i], IGNORE)
            np.testing.assert_array_equal(t["labels"][i], want)
            eos = np.flatnonzero(ids[i] == 257)  # byte tokenizer's EOS ends every document
            assert (t["labels"][i][eos] == IGNORE).all()


@pytest.mark.parametrize("workers", [1, 3])
def test_yaml_pipeline_threads_equal_inline(yaml_oracle, workers):
    path, (chains, _) = yaml_oracle
    got, _ = run_chains(path, ExecutionConfig(runner="threads", workers=workers))
    assert got == chains


# -- trained tokens per dataset ---------------------------------------------------------------


@pytest.mark.parametrize("datasets", [1, 3])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_token_counts_of_packed_batches_per_dataset(algorithm, datasets):
    from collections import Counter

    from zephon_server.engine.token_counts import count_batch_tokens

    inputs = masked(tokenized_stream(0, 60, seed=12, datasets=datasets), seed=12, density=0.4)
    # dataset 2's records carry no loss_mask here: all their tokens are trained
    inputs = [
        r.with_payload({"input_ids": r.payload["input_ids"]}) if r.meta.dataset_id == 2 else r
        for r in inputs
    ]
    rows = rows_of(run_op(PackFlat(max_length=48, algorithm=algorithm), inputs))
    tokens: Counter[int] = Counter()
    trained: Counter[int] = Counter()
    for start in range(0, len(rows), 4):
        for batch in run_op(Batch(microbatch_size=4, drop_last=False), rows[start : start + 4]):
            if isinstance(batch, SampleBatch):
                count_batch_tokens(batch, tokens, trained)
    want_tokens: Counter[int] = Counter()
    want_trained: Counter[int] = Counter()
    for r in inputs:
        want_tokens[r.meta.dataset_id] += len(r.payload["input_ids"])
        mask = r.payload.get("loss_mask")
        want_trained[r.meta.dataset_id] += (
            len(r.payload["input_ids"]) if mask is None else int(mask.sum())
        )
    assert tokens == want_tokens and trained == want_trained
    if datasets == 3:
        assert trained[2] == tokens[2] and trained[0] < tokens[0] and trained[1] < tokens[1]
    else:
        assert 0 < trained[0] < tokens[0]


@pytest.mark.parametrize("op_cls", [PackFlat, PackSequences])
def test_batch_gives_rows_without_loss_mask_ones(op_cls):
    # pack_flat's rows come padded to max_length: the ones stop where its padding starts.
    plain = rows_of(run_op(op_cls(max_length=30), tokenized_stream(0, 10, seed=2)))
    with_mask = rows_of(
        run_op(op_cls(max_length=30), masked(tokenized_stream(0, 10, seed=3), density=0))
    )
    rows = [plain[0], with_mask[0], plain[-1]]  # the last row of a lane is not full
    (batch,) = run_op(Batch(microbatch_size=3), rows)
    mask, pad = batch.tensors["loss_mask"], batch.tensors["padding_mask"]
    assert mask.dtype == np.uint8
    assert (mask[0] == pad[0]).all() and (mask[2] == pad[2]).all()  # trained, padding 0
    assert not mask[1].any()
    assert not pad[2].all()  # a padded plain row is among them


# -- over the wire ---------------------------------------------------------------------------
