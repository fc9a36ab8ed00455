"""Compressed shards either decompress completely or are refused at start-up, naming the file.

Real ``.jsonl.zst`` / ``.jsonl.gz`` files made with zstandard and gzip are cut at several
points (last byte, half, inside the last frame of a multi-frame file, the gzip trailer),
given trailing garbage or damaged; every case is a :class:`DataError` naming the file, what
is wrong and the fix, whatever the dataset's ``on_error``, and ``zephon explain|dump|serve``
exit with status 2 and that one line. Valid multi-frame, multi-member, skippable-frame and
unknown-size files decompress to exactly their content (no false positives).
"""

from __future__ import annotations

import gzip
import io
import struct

import pytest
import zstandard

from zephon_server.engine import decompression
from zephon_server.engine.decompression import IncompleteShardError, decompress_shard
from zephon_testing.scenarios.shard_integrity import (
    CONTENT,
    ROWS,
    gz,
    refused,
    resolve,
    write,
    zst,
    zst_frames,
)

pytestmark = pytest.mark.timeout(60)

assert len(CONTENT) == 8192 * 128


# --------------------------------------------------------------------------------- zstd


@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize("cut", ["last-byte", "half", "one-byte-kept"])
def test_truncated_zstd_frame_is_refused_naming_sizes(tmp_path, cut, on_error):
    data = zst()
    keep = {"last-byte": len(data) - 1, "half": len(data) // 2, "one-byte-kept": 1}[cut]
    path = write(tmp_path, "web.jsonl.zst", data[:keep])
    message = refused(path, on_error)
    if cut == "one-byte-kept":
        assert "truncated: zstd frame 1 (at byte 0) ends before its end mark" in message
    else:
        assert (
            "truncated: zstd frame 1 (at byte 0) ends before its end mark (its header declares "
            f"{len(CONTENT)} bytes, got " in message
        ), message
        got = int(message.split(", got ", 1)[1].split(" ", 1)[0])
        assert got < len(CONTENT)


def test_zstd_multi_frame_file_whose_last_frame_is_cut(tmp_path):
    data = zst_frames(CONTENT, 4)
    last = len(zst(CONTENT[-(len(CONTENT) // 4) :]))
    path = write(tmp_path, "web.jsonl.zst", data[: len(data) - last // 2])
    message = refused(path)
    assert f"truncated: zstd frame 4 (at byte {len(data) - last}) ends before" in message
    # Cut exactly between two frames: a complete file of fewer rows cannot be told apart
    # (what `zstd -t` says too), so it is counted as what it is: three whole frames.
    three = write(tmp_path / "three", "web.jsonl.zst", data[: len(data) - last])
    assert resolve(three) == 3 * 8192 // 4


def test_zstd_frame_without_content_size_cut_inside(tmp_path):
    buf = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(buf, closefd=False) as writer:
        writer.write(CONTENT)
    data = buf.getvalue()
    assert zstandard.get_frame_parameters(data).content_size == zstandard.CONTENTSIZE_UNKNOWN
    path = write(tmp_path, "web.jsonl.zst", data[:-3])
    assert "ends before its end mark (got " in refused(path)


def test_zstd_trailing_garbage_and_corruption(tmp_path):
    data = zst(write_checksum=True)
    garbage = write(tmp_path / "g", "web.jsonl.zst", data + b"this is not zstd")
    assert (
        f"trailing garbage: the bytes at byte {len(data)}, after 1 complete zstd frame(s), "
        "are not a zstd frame" in refused(garbage)
    )
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    corrupt = write(tmp_path / "c", "web.jsonl.zst", bytes(flipped))
    assert "corrupt: zstd frame 1 (at byte 0): " in refused(corrupt)
    not_zstd = write(tmp_path / "n", "web.jsonl.zst", gz())
    assert "not compressed: the file does not start with a zstd frame" in refused(not_zstd)


def test_zstd_header_declaring_another_size_is_refused(tmp_path):
    data = bytearray(zst(b"hello\n" * 1000))
    data[5] += 1  # the header's content size field (the decoder notices: the frame is damaged)
    assert zstandard.frame_content_size(bytes(data)) == 6001
    path = write(tmp_path, "web.jsonl.zst", bytes(data))
    assert "zstd frame 1 (at byte 0)" in refused(path)


def test_zstd_frame_producing_other_than_its_declared_size(tmp_path, monkeypatch):
    """The explicit content-size check, with a decoder that yields one byte too many (libzstd
    itself refuses such frames, so only a stand-in decoder can reach the check)."""

    real = zstandard.ZstdDecompressor

    class Longer:
        def __init__(self) -> None:
            self.inner = real().decompressobj()
            self.eof = False
            self.unused_data = b""

        def decompress(self, data: bytes) -> bytes:
            out = self.inner.decompress(data)
            self.eof, self.unused_data = self.inner.eof, self.inner.unused_data
            return out + b"x" if self.eof else out

    class Decompressor:
        def decompressobj(self) -> Longer:
            return Longer()

    monkeypatch.setattr(decompression.zstandard, "ZstdDecompressor", Decompressor)
    path = write(tmp_path, "web.jsonl.zst", zst(b"hello\n" * 1000))
    with pytest.raises(
        IncompleteShardError,
        match=r"size mismatch: zstd frame 1 \(at byte 0\) "
        r"declares 6000 bytes, got 6001",
    ):
        decompress_shard(str(path), "jsonl.zst")


# --------------------------------------------------------------------------------- gzip


@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize("cut", ["last-byte", "half", "no-trailer"])
def test_truncated_gzip_member_is_refused(tmp_path, cut, on_error):
    data = gz()
    keep = {"last-byte": len(data) - 1, "half": len(data) // 2, "no-trailer": len(data) - 8}[cut]
    path = write(tmp_path, "web.jsonl.gz", data[:keep])
    message = refused(path, on_error)
    assert "truncated: gzip member 1 (at byte 0) ends before its end mark" in message
    if cut == "no-trailer":  # every byte of content came out, yet it is not known to be whole
        assert f"got {len(CONTENT)} bytes of it" in message


def test_gzip_multi_member_file_whose_last_member_is_cut(tmp_path):
    step = -(-len(CONTENT) // 3)
    parts = [gz(CONTENT[i : i + step]) for i in range(0, len(CONTENT), step)]
    data = b"".join(parts)
    path = write(tmp_path, "web.jsonl.gz", data[:-20])
    start = len(parts[0]) + len(parts[1])
    assert f"truncated: gzip member 3 (at byte {start}) ends before" in refused(path)


def test_gzip_crc_and_size_mismatch_and_trailing_garbage(tmp_path):
    data = gz()
    bad_crc = bytearray(data)
    bad_crc[-6] ^= 1
    crc = write(tmp_path / "crc", "web.jsonl.gz", bytes(bad_crc))
    assert "corrupt: gzip member 1 (at byte 0): CRC mismatch" in refused(crc)
    bad_size = bytearray(data)
    bad_size[-3] ^= 1
    size = write(tmp_path / "size", "web.jsonl.gz", bytes(bad_size))
    assert "corrupt: gzip member 1 (at byte 0): size mismatch" in refused(size)
    garbage = write(tmp_path / "garbage", "web.jsonl.gz", data + b"\x00\x00junk")
    assert (
        f"trailing garbage: the bytes at byte {len(data) + 2}, after 1 complete gzip "
        "member(s), are not a gzip member" in refused(garbage)
    )


def test_empty_compressed_file_is_refused(tmp_path):
    for name in ("web.jsonl.gz", "web.jsonl.zst"):
        path = write(tmp_path / name, name, b"")
        assert "truncated: the file is empty (0 bytes)" in refused(path)


# ----------------------------------------------------------------- no false positives


def skippable(payload: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A53, len(payload)) + payload


VALID = {
    "zst-one-frame": lambda: zst(),
    "zst-checksum": lambda: zst(write_checksum=True),
    "zst-unknown-size": lambda: zstandard.ZstdCompressor(write_content_size=False).compress(
        CONTENT
    ),
    "zst-many-frames": lambda: zst_frames(CONTENT, 37),
    "zst-skippable-frames": lambda: (
        skippable(b"meta")
        + zst(CONTENT[:5000])
        + skippable(b"")
        + zst(CONTENT[5000:])
        + skippable(b"tail" * 100)
    ),
    "zst-empty-frame": lambda: zst(b"") + zst(CONTENT),
    "gz-one-member": lambda: gz(),
    "gz-many-members": lambda: b"".join(gz(CONTENT[i : i + 9999]) for i in range(0, 2**20, 9999)),
    "gz-zero-padding": lambda: gz() + b"\x00" * 1000,
    "gz-named": lambda: _gzip_with_name(),
}


def _gzip_with_name() -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile("web.jsonl", "wb", fileobj=buf, mtime=0) as fh:
        fh.write(CONTENT)
    return buf.getvalue()


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_files_decompress_completely(tmp_path, kind, monkeypatch):
    # Small read and output steps, so frame and member ends fall inside and across reads.
    monkeypatch.setattr(decompression, "_READ", 4099)
    monkeypatch.setattr(decompression, "_OUT", 1 << 14)
    ext = "jsonl.zst" if kind.startswith("zst") else "jsonl.gz"
    path = write(tmp_path, f"web.{ext}", VALID[kind]())
    assert bytes(decompress_shard(str(path), ext)) == CONTENT
    assert resolve(path) == len(ROWS)


# ------------------------------------------------------------------- the CLI, as users run it
