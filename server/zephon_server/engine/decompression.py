"""Decompressing a whole ``.jsonl.gz`` / ``.jsonl.zst`` shard, and proving it came out whole.

A compressed shard is decompressed once, when its rows are first counted (at start-up), and
its row count is what the work source builds the data order from. A decoder that stops at
the end of the *file* rather than at the end of the *data* would therefore turn a truncated
download into a shorter, silently different dataset. So the shard is decoded frame by frame
(zstd) or member by member (gzip) with decoders that report where each frame ends, and the
content counts only if:

* every frame/member reaches its end mark (zstd's last block, gzip's CRC-and-size trailer);
* nothing but further complete frames follows (for gzip, also zero padding, which ``gzip``
  itself accepts); an empty file is not a compressed shard;
* each zstd frame whose header declares its content size produced exactly that many bytes
  (gzip's trailer, and zstd's checksum when present, are checked by the decoders).

Anything else raises :class:`IncompleteShardError` naming the file, what is wrong and the fix.

Memory: output goes to a *sink*. The default one is one buffer sized from the header (zstd's
first frame content size, gzip's trailing ISIZE) and the per-call output is kept small, so a
single-frame shard is never held twice; content beyond the header's word (more frames or
members) is joined once. The shard cache passes :class:`~.spill.SpillSink`, which moves a
large content to a spill file as it comes; :func:`decompress_stream` reads the compressed
bytes from a file-like source (an object in ranged GETs), so neither side is held whole.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import zstandard

from .errors import DataError

GZIP = "jsonl.gz"
ZSTD = "jsonl.zst"
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_READ = 1 << 18  # compressed bytes read from the file per step
_OUT = 1 << 20  # target decompressed bytes per decoder call (bounds transient memory)
_MIN_FEED = 1 << 10
_TRUST = 1024  # a header's size is trusted up to this many times the compressed size
FIX = "re-create or re-download the shard, or remove it from the dataset"


class _Source(Protocol):
    """What decoding reads from: a file, or a buffer in memory (:class:`_MemoryFile`)."""

    def read(self, n: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def tell(self) -> int: ...


class IncompleteShardError(DataError):
    """A compressed shard does not decompress completely (truncated, trailing garbage,
    corrupt data, a checksum or size that does not match): its rows cannot be known."""

    def __init__(self, path: str, fmt: str, problem: str) -> None:
        self.path = path
        self.fmt = fmt
        self.problem = problem
        super().__init__(f"cannot decompress shard {path} ({fmt}): {problem}; {FIX}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.path, self.fmt, self.problem))


class Sink(Protocol):
    """Where decompressed bytes go (in order); ``result()`` is what the caller gets."""

    def write(self, data: bytes, /) -> None: ...

    def result(self) -> Any: ...


#: Makes the sink of one decompression from the content size the header expects (0: unknown).
SinkFactory = Callable[[int], Sink]


class _Sink:
    """Decompressed bytes: into one buffer of the expected size, any excess in parts."""

    def __init__(self, expected: int) -> None:
        self.buf = bytearray(max(expected, 0))
        self.pos = 0
        self.parts: list[bytes] = []
        self.total = 0

    def write(self, data: bytes) -> None:
        n = len(data)
        self.total += n
        room = len(self.buf) - self.pos
        if n <= room:
            self.buf[self.pos : self.pos + n] = data
            self.pos += n
            return
        if room:
            self.buf[self.pos :] = data[:room]
            self.pos += room
        self.parts.append(data[room:])

    def result(self) -> bytes | bytearray:
        if not self.parts:
            del self.buf[self.pos :]
            return self.buf
        return b"".join([self.buf, *self.parts])


#: One zstd frame that produced content: (compressed offset, compressed length,
#: decompressed offset, decompressed length).
Frame = tuple[int, int, int, int]


def decompress_shard(
    path: str, fmt: str, frames: list[Frame] | None = None, sink: SinkFactory | None = None
) -> Any:
    """The complete decompressed content of a gzip or zstd shard (all frames/members).

    ``frames``: for zstd, a list that receives every frame that produced content (see
    :data:`Frame`), for the shard index. ``sink``: where the content goes (default: one
    buffer in memory, returned as ``bytes``/``bytearray``; :mod:`.spill` passes a sink that
    moves to a file past a threshold) and the result is ``sink.result()``. Raises
    :class:`IncompleteShardError` when the file does not decompress completely and
    ``OSError`` when it cannot be read.
    """
    with open(path, "rb") as fh:
        return _decompress(fh, path, fmt, os.fstat(fh.fileno()).st_size, frames, sink)


def decompress_bytes(
    data: bytes | bytearray | memoryview,
    name: str,
    fmt: str,
    frames: list[Frame] | None = None,
    sink: SinkFactory | None = None,
) -> Any:
    """The complete decompressed content of a gzip or zstd shard held in memory (an
    object-store shard downloaded whole); errors as :func:`decompress_shard`'s, naming
    ``name`` (its URL)."""
    view = memoryview(data).cast("B")
    return _decompress(_MemoryFile(view), name, fmt, len(view), frames, sink)


def decompress_stream(
    source: _Source,
    name: str,
    fmt: str,
    size: int,
    frames: list[Frame] | None = None,
    sink: SinkFactory | None = None,
) -> Any:
    """:func:`decompress_shard` of a file-like ``source`` of ``size`` bytes (an object read
    in ranged GETs as it is decoded, never held whole); errors name ``name``."""
    return _decompress(source, name, fmt, size, frames, sink)


def _decompress(
    fh: _Source,
    path: str,
    fmt: str,
    size: int,
    frames: list[Frame] | None,
    sink: SinkFactory | None = None,
) -> Any:
    if size == 0:
        raise IncompleteShardError(path, fmt, "truncated: the file is empty (0 bytes)")
    make = sink if sink is not None else _Sink
    if fmt == GZIP:
        return _gunzip(fh, path, size, make)
    if fmt == ZSTD:
        return _unzstd(fh, path, size, frames, make)
    raise ValueError(f"decompress_shard: format must be {GZIP!r} or {ZSTD!r}, got {fmt!r}")


class _MemoryFile:
    """The ``read`` / ``seek`` / ``tell`` of a file over a buffer, without copying it whole
    (``io.BytesIO`` would)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n < 0 else min(len(self._view), self._pos + n)
        out = self._view[self._pos : end].tobytes()
        self._pos = max(self._pos, end)
        return out

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _expected(declared: int, compressed: int) -> int:
    return min(declared, _TRUST * compressed) if declared > 0 else 0


# ---------------------------------------------------------------------------------- gzip


def _gunzip(fh: _Source, path: str, size: int, make: SinkFactory) -> Any:
    fh.seek(max(size - 4, 0))
    isize = int.from_bytes(fh.read(4), "little") if size >= 18 else 0
    fh.seek(0)
    sink = make(_expected(isize, size))
    member, start, got = 0, 0, 0  # member number (1-based once started), its offset, output
    dec: zlib._Decompress | None = None
    offset = 0  # file offset of the first byte of ``data``
    while data := fh.read(_READ):
        while data:
            if dec is None:
                if member:  # zero padding after a member is allowed (as gzip does)
                    data = data.lstrip(b"\x00")
                offset = fh.tell() - len(data)
                if not data:
                    break
                if not data.startswith(_GZIP_MAGIC[: len(data)]):
                    raise IncompleteShardError(path, GZIP, _garbage(offset, member, "gzip member"))
                dec, member, start, got = zlib.decompressobj(31), member + 1, offset, 0
            try:
                out = dec.decompress(data, _OUT)
            except zlib.error as exc:
                raise IncompleteShardError(
                    path, GZIP, f"corrupt: gzip member {member} (at byte {start}): {_zlib(exc)}"
                ) from exc
            sink.write(out)
            got += len(out)
            if dec.eof:
                data, dec = dec.unused_data, None
                offset = fh.tell() - len(data)
            else:
                data = dec.unconsumed_tail
    if dec is not None:
        raise IncompleteShardError(
            path,
            GZIP,
            f"truncated: gzip member {member} (at byte {start}) ends before its end mark "
            f"(the CRC and size trailer); got {got} bytes of it before the file ended",
        )
    return sink.result()


def _zlib(exc: zlib.error) -> str:
    text = str(exc)
    if "incorrect data check" in text:
        return "CRC mismatch (the content does not match the trailer's CRC-32)"
    if "incorrect length check" in text:
        return "size mismatch (the content length does not match the trailer's ISIZE)"
    return text


def _garbage(offset: int, done: int, what: str) -> str:
    if not done:
        return f"not compressed: the file does not start with a {what}"
    return (
        f"trailing garbage: the bytes at byte {offset}, after {done} complete {what}(s), "
        f"are not a {what}"
    )


# ---------------------------------------------------------------------------------- zstd


def _declared(head: bytes) -> int:
    """The content size a zstd frame header declares, or -1 (unknown / not parsable yet)."""
    try:
        return int(zstandard.frame_content_size(head))
    except zstandard.ZstdError:
        return -1


def _is_frame_start(head: bytes) -> bool:
    """Whether ``head`` (the first up to 4 bytes) can start a zstd frame or a skippable one
    (magic ``0x184D2A5?``, little-endian); a short ``head`` is checked as a prefix."""
    if not head:
        return False
    skippable = (head[0] & 0xF0) == 0x50 and b"\x2a\x4d\x18".startswith(head[1:4])
    return _ZSTD_MAGIC.startswith(head[:4]) or skippable


def _unzstd(fh: _Source, path: str, size: int, table: list[Frame] | None, make: SinkFactory) -> Any:
    sink = make(_expected(_declared(fh.read(18)), size))
    fh.seek(0)
    frames = _ZstdFrames(path, sink, table)
    offset = 0
    while data := fh.read(_READ):
        frames.feed(data, offset)
        offset += len(data)
    frames.finish()
    return sink.result()


class _ZstdFrames:
    """Feeds a zstd file to one decoder per frame, checking each frame's end and size.

    Input goes to the decoder in pieces sized from the compression ratio seen so far, so one
    call yields about ``_OUT`` bytes (the decoder has no output limit of its own)."""

    def __init__(self, path: str, sink: Sink, table: list[Frame] | None = None) -> None:
        self.path = path
        self.sink = sink
        self.table = table  # receives each frame that produced content
        self.dctx = zstandard.ZstdDecompressor()
        self.dec: zstandard.ZstdDecompressionObj | None = None
        self.frame = 0  # number of the current (or last) frame, 1-based
        self.start = 0  # file offset of the current frame
        self.head = b""  # the current frame's first bytes (its header)
        self.got = 0  # bytes the current frame produced
        self.fed = 0
        self.out = 0
        self.feed_size = _MIN_FEED

    def feed(self, data: bytes, offset: int) -> None:
        """Decode ``data``, which starts at file offset ``offset``."""
        while data:
            if self.dec is None:
                self._begin(data[:18], offset)
            elif len(self.head) < 18:
                self.head += data[: 18 - len(self.head)]
            piece, data = data[: self.feed_size], data[self.feed_size :]
            rest = self._decode(piece)
            if rest:  # the frame ended inside ``piece``: its rest starts the next frame
                data = rest + data
            used = len(piece) - len(rest)
            offset += used
            if self.dec is None and self.table is not None and self.got:  # a frame ended
                self.table.append((self.start, offset - self.start, self.out - self.got, self.got))
            self.fed += used
            if self.out:
                self.feed_size = min(max(_OUT * self.fed // self.out, _MIN_FEED), _READ)

    def _begin(self, head: bytes, offset: int) -> None:
        if not _is_frame_start(head[:4]):
            raise IncompleteShardError(self.path, ZSTD, _garbage(offset, self.frame, "zstd frame"))
        self.dec = self.dctx.decompressobj()
        self.frame += 1
        self.start, self.head, self.got = offset, head, 0

    def _decode(self, piece: bytes) -> bytes:
        """Decode ``piece``; returns its bytes past the end of the current frame (if it ended)."""
        assert self.dec is not None
        try:
            out = self.dec.decompress(piece)
        except zstandard.ZstdError as exc:
            raise IncompleteShardError(
                self.path, ZSTD, f"corrupt: zstd frame {self.frame} (at byte {self.start}): {exc}"
            ) from exc
        self.sink.write(out)
        self.got += len(out)
        self.out += len(out)
        if not self.dec.eof:
            return b""
        rest = self.dec.unused_data
        self.dec = None
        self._check_size()
        return rest

    def _check_size(self) -> None:
        declared = _declared(self.head)
        if declared >= 0 and declared != self.got:
            raise IncompleteShardError(
                self.path,
                ZSTD,
                f"size mismatch: zstd frame {self.frame} (at byte {self.start}) declares "
                f"{declared} bytes, got {self.got}",
            )

    def finish(self) -> None:
        """Raise unless the file ended exactly at the end of a frame."""
        if self.dec is None:
            return
        declared = _declared(self.head)
        if declared >= 0:
            size = f"its header declares {declared} bytes, got {self.got}"
        else:
            size = f"got {self.got} bytes of it"
        raise IncompleteShardError(
            self.path,
            ZSTD,
            f"truncated: zstd frame {self.frame} (at byte {self.start}) ends before its end "
            f"mark ({size} before the file ended)",
        )
