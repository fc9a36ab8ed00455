"""The wire format's one definition, shared by the server and the client.

Depends on numpy and the standard library only, so the server's engine can hash batches with
it without importing gRPC and the client can verify them without importing the server.

* **Tensors** travel as raw little-endian C-order bytes with a dtype code (the values of the
  ``zephon.v1.DType`` enum, pinned against the proto by a test) and a shape, in name order.
  :func:`wire_tensors` normalises a batch's tensors that way once; everything that needs
  the wire view (the digest, the shared-memory ring, the encoder, byte counts) shares it.
* **Content digest**: ``sha256(for each tensor in name order: name, dtype, shape, raw
  bytes)``, each field prefixed with its length as a little-endian uint64; dtype is numpy's
  dtype string with little-endian byte order (``"<i4"``, ``"|b1"``), shape the decimal dims
  joined by ``","``.
* **Chain digest**: ``chain[k] = sha256(chain[k-1] || content[k])`` with
  ``chain[-1] = CHAIN_SEED`` (32 zero bytes), so a client can prove that a resumed stream is
  the uninterrupted one.
* **Shared-memory rings**: the file name pattern and the nonce size both sides check.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

import numpy as np

__all__ = [
    "CHAIN_SEED",
    "DIGEST_SIZE",
    "DTYPES",
    "RING_DIR",
    "RING_NONCE_SIZE",
    "RING_PREFIX",
    "SUPPORTED_DTYPES",
    "WireTensors",
    "chain_digest",
    "content_digest",
    "digest_wire",
    "dtype_code",
    "wire_array",
    "wire_nbytes",
    "wire_tensors",
]

CHAIN_SEED = bytes(32)
"""The chain digest before a lane's first batch (seq 0)."""
DIGEST_SIZE = 32
"""Bytes of a content or chain digest (sha256)."""

DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<i4"),  # DTYPE_INT32
    2: np.dtype("<i8"),  # DTYPE_INT64
    3: np.dtype("<u2"),  # DTYPE_UINT16
    4: np.dtype("<u4"),  # DTYPE_UINT32
    5: np.dtype("<f4"),  # DTYPE_FLOAT32
    6: np.dtype("?"),  # DTYPE_BOOL
    7: np.dtype("u1"),  # DTYPE_UINT8
}
"""Wire dtype code (``zephon.v1.DType`` value) → the little-endian numpy dtype of its bytes."""
_CODES: dict[tuple[str, int], int] = {(d.kind, d.itemsize): code for code, d in DTYPES.items()}
SUPPORTED_DTYPES = ("int32", "int64", "uint16", "uint32", "float32", "bool", "uint8")
"""The numpy dtypes the wire carries, by name (for error messages)."""

RING_DIR = "/dev/shm/"
"""Where a server makes the shared-memory ring files it offers to clients on its host."""
RING_PREFIX = "zephon-ring-"
"""The name every ring file starts with (``<prefix><server pid>-<lane>-<random>``)."""
RING_NONCE_SIZE = 16
"""Random bytes at the start of a ring file; a client that reads them is on the same host."""

WireTensors = tuple[tuple[str, np.ndarray], ...]
"""A batch's tensors as they travel: ``(name, array)`` in name order, each array
little-endian and C-contiguous."""


def dtype_code(dtype: np.dtype) -> int | None:
    """The wire dtype code of a numpy dtype, whatever its byte order; None if unsupported."""
    return _CODES.get((dtype.kind, dtype.itemsize))


def wire_array(arr: np.ndarray) -> np.ndarray:
    """The array as it travels: C-contiguous, little-endian (the same array when it is)."""
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr)


def wire_tensors(tensors: Mapping[str, np.ndarray]) -> WireTensors:
    """``tensors`` in name order, each as :func:`wire_array`: the one wire view of a batch."""
    return tuple((name, wire_array(tensors[name])) for name in sorted(tensors))


def wire_nbytes(wire: WireTensors) -> int:
    """Bytes of tensor data in a wire view."""
    return sum(arr.nbytes for _, arr in wire)


def digest_wire(wire: WireTensors) -> bytes:
    """The content digest of a wire view (see the module docstring).

    The same bytes are hashed as field after field, but joined: every header and every tensor
    smaller than :data:`_JOINED` go to the hash in one update before the next large tensor's
    buffer, which is hashed in place (no copy). CPython's ``hashlib`` releases the GIL for
    each update of an object once one update was large, so hashing a batch field by field
    handed the GIL to the other threads about 60 times a batch for a few bytes each
    (``docs/decisions.md``, "The chat figure on the shipped allocator; fewer GIL releases per
    batch").
    """
    h = hashlib.sha256()
    joined = bytearray()
    for name, arr in wire:
        dtype = arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
        for field in (name.encode(), dtype.str.encode(), ",".join(map(str, arr.shape)).encode()):
            joined += struct.pack("<Q", len(field))
            joined += field
        joined += struct.pack("<Q", arr.nbytes)
        if not arr.size:
            continue
        data = arr.reshape(-1).view(np.uint8).data  # the buffer in place: tobytes()'s bytes
        if arr.nbytes < _JOINED:
            joined += data
        else:
            h.update(joined)
            joined.clear()
            h.update(data)
    h.update(joined)
    return h.digest()


_JOINED = 2048  # bytes below which a tensor's data joins the headers (hashlib's GIL threshold)


def content_digest(tensors: Mapping[str, np.ndarray]) -> bytes:
    """sha256 over every tensor in name order: name, dtype, shape, little-endian bytes."""
    return digest_wire(wire_tensors(tensors))


def chain_digest(previous: bytes, content: bytes) -> bytes:
    """The next link of a lane's chain: ``sha256(previous || content)``."""
    return hashlib.sha256(previous + content).digest()
