"""Wire format: engine batches → proto → numpy, and the digests the client verifies."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from tests.support.builders import make_pipeline
from zephon_client import wire as cw
from zephon_client.tail import end_line
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.errors import ZephonError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.records import DocRef, SampleBatch, SampleMeta, Span
from zephon_server.service import wire as sw
from zephon_server.service.encoding import (
    encode_batch_response,
    encode_batches,
    encode_group_response,
    varint,
)
from zephon_testing.wire_oracle import batch_response, batch_to_proto
from zephon_wire import CHAIN_SEED, content_digest

DTYPES = ["int32", "int64", "uint16", "uint32", "float32", "bool", "uint8"]


def sample_tensors(rows: int = 2, length: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    """One tensor of every supported dtype, with varied values."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name in DTYPES:
        dtype = np.dtype(name)
        if dtype.kind == "b":
            arr = rng.integers(0, 2, size=(rows, length)).astype(bool)
        elif dtype.kind == "f":
            arr = rng.standard_normal((rows, length)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            arr = rng.integers(info.min, info.max, size=(rows, length), dtype=dtype)
        out[f"t_{name}"] = arr
    return out


def engine_batch(
    tensors: dict[str, np.ndarray], *, lane: int = 3, seq: int = 0, previous: bytes = b""
) -> NumberedBatch:
    """A batch with two rows (the first packs two documents) and one tombstone."""
    d0, d1, d2, d3 = (DocRef(1, 2, 10 + i, i % 2) for i in range(4))
    rows = (
        SampleMeta(lane, (0, 0), 1, d0, (d0,), spans=(Span(d0, 0, 3), Span(d1, 0, 2))),
        SampleMeta(lane, (0, 1), 1, d2, (d1, d2), spans=(Span(d2, 7, 5),)),
    )
    tombstones = (SampleMeta(lane, (0, 2), 1, d3, (d3,), tombstone="malformed"),)
    return NumberedBatch.number(
        SampleBatch(lane, tensors, rows, tombstones), seq, previous or CHAIN_SEED
    )


def through_the_wire(batch: NumberedBatch) -> cw.DecodedBatch:
    """The batch as the service sends it (hand-encoded bytes), decoded by the client."""
    data = encode_batch_response(batch)
    assert data == batch_response(batch).SerializeToString()
    response = pb.StreamBatchesResponse.FromString(data)
    assert response.WhichOneof("kind") == "batch"
    return cw.decode_batch(response.batch)


def test_round_trip_every_dtype():
    tensors = sample_tensors()
    batch = engine_batch(tensors, seq=17)
    got = through_the_wire(batch)
    assert (got.lane, got.seq) == (3, 17)
    assert sorted(got.tensors) == sorted(tensors)
    for name, arr in tensors.items():
        assert got.tensors[name].dtype == arr.dtype, name
        assert got.tensors[name].shape == arr.shape, name
        np.testing.assert_array_equal(got.tensors[name], arr)
    assert got.digest == batch.digest
    assert got.chain_digest == batch.chain_digest
    cw.verify(got, CHAIN_SEED)


def test_tensors_go_out_in_name_order_as_raw_bytes():
    tensors: dict[str, np.ndarray] = {
        "zeta": np.arange(3, dtype=np.int32),
        "alpha": np.ones((2, 2), dtype=np.uint8),
    }
    msg = batch_to_proto(engine_batch(tensors))
    assert [t.name for t in msg.tensors] == ["alpha", "zeta"]
    zeta = msg.tensors[1]
    assert zeta.dtype == pb.DTYPE_INT32
    assert list(zeta.shape) == [3]
    assert zeta.data == b"\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00"


def test_decoded_arrays_share_the_message_bytes():
    msg = batch_to_proto(engine_batch({"input_ids": np.arange(8, dtype=np.int32)}))
    arr = cw.decode_batch(msg).tensors["input_ids"]
    assert not arr.flags.writeable
    assert not arr.flags.owndata


def test_rows_and_closed_documents():
    got = through_the_wire(engine_batch(sample_tensors()))
    assert got.rows == [
        [cw.Segment(1, 2, 10, 0, 0, 3), cw.Segment(1, 2, 11, 1, 0, 2)],
        [cw.Segment(1, 2, 12, 0, 7, 5)],
    ]
    assert got.num_rows == 2
    assert got.closed == [
        cw.ClosedDocument(1, 2, 10, 0, ""),
        cw.ClosedDocument(1, 2, 11, 1, ""),
        cw.ClosedDocument(1, 2, 12, 0, ""),
        cw.ClosedDocument(1, 2, 13, 1, "malformed"),
    ]


def test_rows_and_closed_are_decoded_on_first_read_from_the_batch_alone():
    msg = batch_to_proto(engine_batch(sample_tensors()))
    expected_rows = [[s.row for s in row.segments] for row in msg.rows]
    expected_closed = [(c.row, c.tombstone) for c in msg.closed]
    batch = cw.decode_batch(msg)
    del msg  # the batch keeps what it has not decoded yet
    gc.collect()
    assert [[s.row for s in row] for row in batch.rows] == expected_rows == [[10, 11], [12]]
    assert [(c.row, c.tombstone) for c in batch.closed] == expected_closed
    assert expected_closed[-1] == (13, "malformed")
    assert batch.rows is batch.rows  # decoded once
    bare = cw.DecodedBatch(lane=0, seq=0, tensors={})
    assert bare.rows == [] and bare.closed == [] and bare.num_rows == 0


@pytest.mark.parametrize("name", DTYPES)
def test_digest_survives_the_wire(name):
    """The client recomputes the server's digest from the tensors it decoded."""
    tensors = sample_tensors(rows=3, length=4, seed=1)
    single = {"x": tensors[f"t_{name}"]}
    assert cw.content_digest is content_digest  # one definition (zephon_wire)
    decoded = through_the_wire(engine_batch(single)).tensors
    assert content_digest(decoded) == content_digest(single)


def test_digest_survives_the_wire_for_odd_layouts():
    base = np.arange(24, dtype=np.int64).reshape(4, 6)
    cases = {
        "big_endian": base.astype(">i8"),
        "transposed": base.T,
        "strided": base[:, ::2],
        "empty": np.zeros((0, 5), dtype=np.int32),
        "mask": base % 3 == 0,
    }
    for name, arr in cases.items():
        single = {name: arr}
        decoded = through_the_wire(engine_batch(single)).tensors[name]
        np.testing.assert_array_equal(decoded, arr)
        assert content_digest({name: decoded}) == content_digest(single), name
    assert cw.CHAIN_SEED == CHAIN_SEED == bytes(32)


def test_big_endian_arrays_are_sent_little_endian():
    values = np.arange(-3, 3, dtype=np.int32).reshape(2, 3)
    tensors = {
        "i32": values.astype(">i4"),
        "f32": (values / 2).astype(">f4"),
        "u16": np.arange(6, dtype=">u2"),
    }
    msg = batch_to_proto(engine_batch(tensors))
    data = {t.name: t.data for t in msg.tensors}
    assert data["i32"] == values.astype("<i4").tobytes()
    assert data["f32"] == (values / 2).astype("<f4").tobytes()
    assert data["u16"] == np.arange(6, dtype="<u2").tobytes()
    got = cw.decode_batch(msg)
    for name, arr in tensors.items():
        assert got.tensors[name].dtype.byteorder in ("<", "=")
        np.testing.assert_array_equal(got.tensors[name], arr)
    cw.verify(got, CHAIN_SEED)


def lane_of_batches(n: int = 4) -> list[cw.DecodedBatch]:
    out, chain = [], CHAIN_SEED
    for seq in range(n):
        batch = engine_batch(sample_tensors(seed=seq), seq=seq, previous=chain)
        chain = batch.chain_digest
        out.append(through_the_wire(batch))
    return out


def test_chain_verification_passes_for_an_uninterrupted_lane():
    chain = cw.CHAIN_SEED
    for batch in lane_of_batches():
        cw.verify(batch, chain)
        chain = batch.chain_digest


def test_chain_verification_fails_when_a_tensor_byte_changes():
    batches = lane_of_batches(2)
    victim = batches[1]
    arr = victim.tensors["t_uint8"].copy()
    arr.flat[3] ^= 1
    victim.tensors["t_uint8"] = arr
    with pytest.raises(cw.ChainMismatch, match=r"lane 3 seq 1: content digest mismatch") as err:
        cw.verify(victim, batches[0].chain_digest)
    assert (err.value.lane, err.value.seq) == (3, 1)
    assert err.value.found.hex() in str(err.value)
    assert err.value.expected.hex() in str(err.value)
    assert isinstance(err.value, ValueError)


def test_chain_verification_fails_when_the_order_changes():
    b0, b1, b2, _ = lane_of_batches()
    cw.verify(b0, cw.CHAIN_SEED)
    with pytest.raises(cw.ChainMismatch, match=r"lane 3 seq 2: chain digest mismatch"):
        cw.verify(b2, b0.chain_digest)  # b1 skipped
    with pytest.raises(cw.ChainMismatch, match="seq 0: chain digest"):
        cw.verify(b0, b1.chain_digest)  # replayed
    with pytest.raises(cw.ChainMismatch, match="seq 1: chain digest"):
        cw.verify(b1, cw.CHAIN_SEED)


def test_chain_verification_fails_when_tensor_names_swap():
    (batch,) = lane_of_batches(1)
    batch.tensors["t_int32"], batch.tensors["t_uint32"] = (
        batch.tensors["t_uint32"].view(np.int32),
        batch.tensors["t_int32"].view(np.uint32),
    )
    with pytest.raises(cw.ChainMismatch, match="content digest"):
        cw.verify(batch, cw.CHAIN_SEED)


@pytest.mark.parametrize("dtype", ["float64", "float16", "int16", "int8", "complex64", "U3"])
def test_unsupported_dtype_names_tensor_and_dtype(dtype):
    tensors = {"input_ids": np.zeros(3, dtype=np.int32), "weird": np.zeros(3, dtype=dtype)}
    batch = engine_batch(tensors)
    for encode in (batch_to_proto, encode_batch_response):
        with pytest.raises(sw.WireError, match=rf"tensor 'weird' has dtype {np.dtype(dtype)}"):
            encode(batch)
    assert issubclass(sw.WireError, ZephonError)


def test_batches_cannot_exist_unnumbered_or_undigested():
    """A numbered batch is built once with seq and digests: the encoder never sees one
    without (the check it used to make is the constructor's)."""
    good = engine_batch({"input_ids": np.zeros(3, dtype=np.int32)}, seq=4)
    assert good.seq == 4 and len(good.digest) == len(good.chain_digest) == 32
    with pytest.raises(ValueError, match="seq must be >= 0, got -1"):
        dataclasses.replace(good, seq=-1)
    with pytest.raises(ValueError, match="chain_digest of lane 3 seq 4 has 0 bytes"):
        dataclasses.replace(good, chain_digest=b"")
    with pytest.raises(dataclasses.FrozenInstanceError):
        good.seq = 5  # type: ignore[misc]


def test_the_wire_view_is_made_once_and_shared():
    """Digest, size, encoder and ring read the batch's one wire view."""
    tensors = {"zeta": np.arange(6, dtype=">i4"), "alpha": np.ones((2, 3), dtype=np.uint8)}
    batch = engine_batch(tensors)
    assert [name for name, _ in batch.wire] == ["alpha", "zeta"]
    assert batch.wire[1][1].dtype == np.dtype("<i4")
    assert batch.nbytes == 6 + 24
    assert batch.digest == content_digest(tensors)
    data = encode_batch_response(batch)
    assert batch.wire[1][1].tobytes() in data


def _batch_of_every_shape() -> list[NumberedBatch]:
    """Batches that exercise each encoding rule: zero (omitted) and multi-byte varints, empty
    rows and tensors, tombstones with and without a reason, every dtype and odd layouts."""
    big = DocRef(7, 300, 2**40 + 5, 130)
    zero = DocRef(0, 0, 0, 0)
    out = [engine_batch(sample_tensors(), lane=0, seq=0), engine_batch(sample_tensors(), seq=2**35)]
    odd = {
        "": np.arange(3, dtype=np.int32),
        "big_endian": np.arange(12, dtype=">i8").reshape(3, 4),
        "strided": np.arange(24, dtype=np.uint16).reshape(4, 6)[:, ::2],
        "empty": np.zeros((0, 5), dtype=np.int32),
        "scalar": np.array(5, dtype=np.float32),
        "é_unicode": np.ones((2, 200), dtype=bool),
    }
    rows = (
        SampleMeta(300, (0, 0), 1, big, (big, zero), spans=(Span(big, 0, 0), Span(zero, 2**20, 1))),
        SampleMeta(300, (0, 1), 1, zero, (), spans=()),
    )
    tombstones = (
        SampleMeta(300, (0, 2), 1, big, (big,), tombstone="malformed: é"),
        SampleMeta(300, (0, 3), 1, zero, (zero, big), tombstone=""),
    )
    out.append(NumberedBatch.number(SampleBatch(300, odd, rows, tombstones), 127, CHAIN_SEED))
    return out


def test_hand_encoded_batches_are_byte_identical_to_protobuf():
    """The service sends encode_batch_response's bytes; a client must not tell them from
    protobuf's serialization of the same message."""
    for batch in _batch_of_every_shape():
        assert encode_batch_response(batch) == batch_response(batch).SerializeToString()
    for value in (0, 1, 127, 128, 300, 2**32, 2**63):
        field = pb.Ack(next_seq=value).SerializeToString()
        assert varint(value) == (field[1:] if value else b"\x00")
    with pytest.raises(sw.WireError, match="unsigned"):
        varint(-1)


def test_hand_encoded_batch_groups_are_byte_identical_to_protobuf():
    """A BatchGroup of any batches encodes as protobuf serializes it; a group of one is a
    group too (the servicer sends a lone batch as SampleBatch instead), an empty one an error."""
    batches = _batch_of_every_shape()
    for group in (batches, batches[:1], batches[1:3]):
        message = pb.StreamBatchesResponse(
            batches=pb.BatchGroup(batches=[batch_to_proto(b) for b in group])
        )
        assert encode_group_response(group) == message.SerializeToString()
    with pytest.raises(sw.WireError, match="at least one batch"):
        encode_group_response([])
    # What the servicer sends: a lone batch as SampleBatch, several as a group.
    assert encode_batches(batches[:1]) == encode_batch_response(batches[0])
    assert encode_batches(batches[:2]) == encode_group_response(batches[:2])


def test_end_of_stream():
    chain = bytes(range(32))
    msg = pb.StreamBatchesResponse.FromString(sw.end_response(9, chain).SerializeToString())
    assert msg.WhichOneof("kind") == "end"
    assert (msg.end.next_seq, msg.end.chain_digest) == (9, chain)


def malformed(**changes) -> pb.SampleBatch:
    tensor = pb.Tensor(name="x", dtype=pb.DTYPE_INT32, shape=[2], data=bytes(8))
    for key, value in changes.items():
        if key == "shape":
            del tensor.shape[:]
            tensor.shape.extend(value)
        else:
            setattr(tensor, key, value)
    return pb.SampleBatch(lane=1, seq=2, tensors=[tensor])


def test_decode_rejects_malformed_tensors():
    assert cw.decode_batch(malformed()).tensors["x"].tolist() == [0, 0]
    with pytest.raises(cw.WireError, match=r"tensor 'x': 7 bytes of data, but shape \[2\]"):
        cw.decode_batch(malformed(data=bytes(7)))
    with pytest.raises(cw.WireError, match="tensor 'x': unsupported dtype DTYPE_UNSPECIFIED"):
        cw.decode_batch(malformed(dtype=pb.DTYPE_UNSPECIFIED))
    with pytest.raises(cw.WireError, match="tensor 'x': unsupported dtype 42"):
        cw.decode_batch(malformed(dtype=42))
    with pytest.raises(cw.WireError, match="negative dimension"):
        cw.decode_batch(malformed(shape=[-2, -1]))
    twice = malformed()
    twice.tensors.append(twice.tensors[0])
    with pytest.raises(cw.WireError, match="lane 1 seq 2: tensor 'x' appears twice"):
        cw.decode_batch(twice)


def test_client_and_server_dtype_tables_agree():
    for code, dtype in cw.DTYPES.items():
        assert sw.wire_dtype("t", dtype) == code
        assert sw.wire_dtype("t", dtype.newbyteorder(">")) == code
    assert set(cw.DTYPES) == {v for k, v in pb.DType.items() if k != "DTYPE_UNSPECIFIED"}
    assert sorted(str(d) for d in cw.DTYPES.values()) == sorted(sw.SUPPORTED_DTYPES)


def test_real_pipeline_batches_verify_on_the_client(corpus_specs):
    """Batches of a real run (byte tokenizer, pack_flat, batch) travel and chain-verify."""
    pipe = make_pipeline(corpus_specs, lanes=2, ops=[("pack_flat", {"max_length": 32})])
    pipe.batch(microbatch_size=4)
    chains = dict.fromkeys(range(2), cw.CHAIN_SEED)
    seen = 0
    for batch in pipe.run(ExecutionConfig(runner="inline")).batches():
        got = through_the_wire(batch)
        cw.verify(got, chains[got.lane])
        chains[got.lane] = got.chain_digest
        assert len(got.rows) == got.tensors["input_ids"].shape[0]
        for name, arr in batch.tensors.items():
            np.testing.assert_array_equal(got.tensors[name], arr)
        seen += 1
        if seen >= 12:
            break
    assert seen >= 4


def test_end_of_stream_carries_documents_closed_after_the_last_batch():
    d0, d1 = DocRef(1, 2, 30, 0), DocRef(0, 1, 7, 3)
    tombstones = (
        SampleMeta(3, (5, 0), 1, d0, (d0,), tombstone="malformed"),
        SampleMeta(3, (5, 1), 0, d1, (d1,), tombstone="drop_last"),
    )
    chain = bytes(range(32))
    data = sw.end_response(12, chain, tombstones).SerializeToString()
    response = pb.StreamBatchesResponse.FromString(data)
    assert response.WhichOneof("kind") == "end"
    end = cw.decode_end(3, response.end)
    assert (end.lane, end.next_seq, end.chain_digest) == (3, 12, chain)
    assert end.closed == [
        cw.ClosedDocument(1, 2, 30, 0, "malformed"),
        cw.ClosedDocument(0, 1, 7, 3, "drop_last"),
    ]
    assert cw.decode_end(0, sw.end_response(0, bytes(32)).end).closed == []
    assert end_line(end) == (
        "lane 3: end of stream at seq 12; closed after the last batch: 1 drop_last, 1 malformed"
    )
    assert end_line(cw.decode_end(0, sw.end_response(5, chain).end)) == (
        "lane 0: end of stream at seq 5"
    )
