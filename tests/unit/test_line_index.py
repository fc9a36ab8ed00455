"""The newline scan by words against a byte-by-byte reference, at every density and length."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_server.engine import line_index
from zephon_server.engine.line_index import line_starts, newline_starts


def reference(data: bytes, offset: int) -> list[int]:
    return [offset + i + 1 for i, byte in enumerate(data) if byte == 10]


@pytest.mark.parametrize("density", [0.0, 1 / 5000, 1 / 300, 1 / 20, 1 / 2, 1.0])
@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 63, 4096 + 5, 100_003])
@pytest.mark.parametrize("block", [8, 13, 1003, 1 << 20])
def test_newline_starts_matches_a_byte_scan(
    monkeypatch: pytest.MonkeyPatch, density: float, size: int, block: int
) -> None:
    # Sparse densities take the word path, dense ones the byte path; block sizes that are not
    # a multiple of 8 leave a tail after the whole words of every block.
    monkeypatch.setattr(line_index, "_BLOCK", block)
    rng = np.random.default_rng(size + int(density * 1e6))
    data = np.where(rng.random(size) < density, 10, rng.integers(11, 256, size)).astype(np.uint8)
    got = newline_starts(data.tobytes(), offset=1000)
    assert got.dtype == np.int64
    assert got.tolist() == reference(data.tobytes(), 1000)


def test_newlines_at_word_edges() -> None:
    # A newline as the first and last byte of a word, of the whole words, and of the tail.
    data = bytearray(b"x" * 37)
    for pos in (0, 7, 8, 15, 31, 32, 36):
        data[pos] = 10
    assert newline_starts(bytes(data)).tolist() == reference(bytes(data), 0)
    assert line_starts(bytes(data)).tolist() == [0, *reference(bytes(data), 0)]


@pytest.mark.parametrize("size", [8, 4096, 1 << 20])
def test_read_buffers_start_on_a_page(size: int) -> None:
    # A read into a buffer 8-24 bytes past a cache line took the kernel 4-5 times as long on
    # the benchmark machine's AMD CPU; a large np.empty starts 16 bytes into a page.
    scratch = line_index._Scratch(size)
    for buffer in (scratch.data, scratch.mask):
        assert buffer.ctypes.data % 4096 == 0
        assert len(buffer) == size
    assert scratch.data.dtype == np.uint8 and scratch.mask.dtype == np.bool_
