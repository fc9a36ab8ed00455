"""Batch digests: a content digest per batch and a per-lane chain.

``content = sha256( for each tensor in name order: name, dtype, shape, raw bytes )`` with
each field length-prefixed, and ``chain[k] = sha256(chain[k-1] || content[k])`` starting from
32 zero bytes, so a client can prove a resumed stream equals the uninterrupted one. Tensors
are hashed as little-endian C-order bytes (the wire format).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

CHAIN_SEED = bytes(32)


def wire_array(arr: np.ndarray) -> np.ndarray:
    """The array as it travels: C-contiguous, little-endian."""
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not _LITTLE):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr)


_LITTLE = np.little_endian


def _field(h: Any, data: Any) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def content_digest(tensors: Mapping[str, np.ndarray]) -> bytes:
    """sha256 over every tensor in name order: name, dtype, shape, bytes."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        arr = wire_array(tensors[name])
        _field(h, name.encode())
        _field(
            h,
            arr.dtype.newbyteorder("<").str.encode()
            if arr.dtype.itemsize > 1
            else arr.dtype.str.encode(),
        )
        _field(h, ",".join(str(d) for d in arr.shape).encode())
        # Hash the array's buffer in place (no copy); same bytes as tobytes().
        h.update(struct.pack("<Q", arr.nbytes))
        if arr.size:
            h.update(arr.reshape(-1).view(np.uint8).data)
    return h.digest()


def chain_digest(previous: bytes, content: bytes) -> bytes:
    """The next link of a lane's chain."""
    return hashlib.sha256(previous + content).digest()
