"""The one wire module (``zephon_wire``) against known vectors and the proto.

The server's engine and the client both digest and normalise tensors with it; these vectors
were computed with the definition the server used before the module existed, so a change that
alters a single digest byte fails here (and in the goldens).
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

import zephon_wire as zw
from zephon_client import ring as client_ring
from zephon_client import wire as client_wire
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.delivery import ring as server_ring

_BASE = np.arange(24, dtype=np.int64).reshape(4, 6)
KNOWN = {
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855": {},
    "3a4f5a7e8267f5d0fbc41b2718013311a032d79c0eee6933b64388b179419112": {
        "input_ids": np.arange(6, dtype=np.int32).reshape(2, 3)
    },
    "63a18a03617d46199eb03aa6cf72df02af22023543b7d22a2722d92b052ebcf5": {
        "b": np.array([True, False, True]),
        "a": np.arange(4, dtype=np.uint16),
        "f": np.array([0.5, -1.0], dtype=np.float32),
    },
    "0ec4a019f4f42c8b46e90c6d7e8317166420d4648015c708289a8f6c5494f4ff": {"x": _BASE.astype(">i8")},
    "d78b56ce4516cacea594b92c7f12213dc3fadd0ecca23544d278341faa44d93c": {"x": _BASE[:, ::2]},
    "a93d212cfdc739275ac6241622021f323c15b20d5ae79893a98e281b3dc83fd9": {
        "x": np.zeros((0, 5), dtype=np.int32)
    },
    "fbd0a25e9ebdbde9236ca62ac22258103bd9241400122e7ed30d2103fd9b2565": {
        "s": np.array(5, dtype=np.float32)
    },
}


def test_content_digest_known_vectors():
    for expected, tensors in KNOWN.items():
        assert zw.content_digest(tensors).hex() == expected, sorted(tensors)
        assert zw.digest_wire(zw.wire_tensors(tensors)).hex() == expected


def test_content_digest_follows_the_documented_layout():
    """Recomputed from the definition with hashlib alone: name, dtype, shape, bytes."""
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    h = hashlib.sha256()
    for field in (b"input_ids", b"<i4", b"2,3", arr.astype("<i4").tobytes()):
        h.update(struct.pack("<Q", len(field)) + field)
    assert zw.content_digest({"input_ids": arr}) == h.digest()


def test_chain_digest_known_vector():
    content = zw.content_digest(
        KNOWN["3a4f5a7e8267f5d0fbc41b2718013311a032d79c0eee6933b64388b179419112"]
    )
    chain = zw.chain_digest(zw.CHAIN_SEED, content)
    assert chain.hex() == "f06fe938676094b4ac48026eb5118f54dd0a84ebde43c40696503aac9f6feb66"
    assert chain == hashlib.sha256(bytes(32) + content).digest()
    assert bytes(zw.DIGEST_SIZE) == zw.CHAIN_SEED


def test_wire_tensors_are_sorted_little_endian_contiguous_and_shared():
    native = np.arange(6, dtype=np.int32)
    tensors = {"z": native, "a": _BASE.astype(">i8"), "m": _BASE[:, ::2]}
    wire = zw.wire_tensors(tensors)
    assert [name for name, _ in wire] == ["a", "m", "z"]
    for _, arr in wire:
        assert arr.flags.c_contiguous and arr.dtype.byteorder in ("<", "=", "|")
    assert wire[2][1] is native  # already wire-shaped: no copy
    assert zw.wire_nbytes(wire) == 24 * 8 + 12 * 8 + 6 * 4


def test_dtype_table_is_the_proto_enum():
    names = {v: k for k, v in pb.DType.items()}
    expected = {
        "DTYPE_INT32": "<i4",
        "DTYPE_INT64": "<i8",
        "DTYPE_UINT16": "<u2",
        "DTYPE_UINT32": "<u4",
        "DTYPE_FLOAT32": "<f4",
        "DTYPE_BOOL": "|b1",
        "DTYPE_UINT8": "|u1",
    }
    assert {names[code]: d.str for code, d in zw.DTYPES.items()} == expected
    for code, dtype in zw.DTYPES.items():
        assert zw.dtype_code(dtype) == code
        assert zw.dtype_code(dtype.newbyteorder(">")) == code
    assert zw.dtype_code(np.dtype("float64")) is None
    assert sorted(np.dtype(d).str for d in zw.SUPPORTED_DTYPES) == sorted(expected.values())
    assert client_wire.DTYPES is zw.DTYPES


def test_ring_constants_are_defined_once():
    assert client_ring.RING_DIR == zw.RING_DIR == "/dev/shm/"
    assert client_ring.RING_PREFIX == server_ring.PREFIX == zw.RING_PREFIX
    assert str(server_ring.SHM_DIR) + "/" == zw.RING_DIR
    assert server_ring.NONCE_SIZE == zw.RING_NONCE_SIZE == 16


def _field_by_field(tensors: dict[str, np.ndarray]) -> bytes:
    """The documented definition, one update per field."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        little = arr.astype(arr.dtype.newbyteorder("<")) if arr.dtype.itemsize > 1 else arr
        shape = ",".join(str(d) for d in arr.shape).encode()
        for field in (name.encode(), little.dtype.str.encode(), shape, little.tobytes()):
            h.update(struct.pack("<Q", len(field)) + field)
    return h.digest()


def test_joined_updates_digest_the_same_bytes_at_every_size():
    """Small tensors join the headers, large ones are hashed in place: the bytes hashed (and so
    the digest) are those of the field-by-field definition, on both sides of the threshold."""
    rng = np.random.default_rng(5)
    sizes = [0, 1, 511, 512, 513, 2047, 2048, 2049, 70_000]
    for i in range(40):
        picked = rng.choice(sizes, size=int(rng.integers(1, 7)))
        tensors = {
            f"t{k}": rng.integers(0, 255, size=int(n), dtype=np.uint8).view(np.uint8)
            if k % 3 == 0
            else rng.integers(-9, 9, size=int(n) // 4, dtype=np.int32)
            for k, n in enumerate(picked)
        }
        assert zw.content_digest(tensors) == _field_by_field(tensors), (i, picked)


def test_a_batch_is_hashed_in_few_updates(monkeypatch):
    """hashlib releases the GIL on every update once one was large: headers and small tensors
    go in one update before each large tensor, not one update per field."""
    updates: list[int] = []
    sha256 = hashlib.sha256

    class Counting:
        def __init__(self) -> None:
            self._h = sha256()

        def update(self, data: bytes) -> None:
            updates.append(len(memoryview(data).cast("B")))
            self._h.update(data)

        def digest(self) -> bytes:
            return self._h.digest()

    tensors = {f"small{k}": np.arange(8, dtype=np.int32) for k in range(6)}
    tensors |= {"big_a": np.zeros((8, 2048), np.int32), "big_b": np.ones((8, 2048), np.int32)}
    expected = zw.content_digest(tensors)
    monkeypatch.setattr(zw.hashlib, "sha256", Counting)
    assert zw.content_digest(tensors) == expected
    assert len(updates) == 5, updates  # headers+small, big_a, headers, big_b, the rest
