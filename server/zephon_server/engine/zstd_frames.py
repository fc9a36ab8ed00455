"""Reading rows of a multi-frame ``.jsonl.zst`` shard one frame at a time.

The shard index stores a zstd shard's frame table (:data:`~.decompression.Frame`: where each
frame is in the file and in the content) and the line starts of its content, both taken from
a decompression that was verified complete. With them, rows can be read without
decompressing the whole shard: the frames overlapping the rows' byte ranges are read with
one ``pread`` each and decompressed on their own (a row crossing a frame boundary is joined
from both). Each frame must decode to exactly its recorded length and end at its end mark,
otherwise the file is not the one that was indexed (:class:`~.decompression.IncompleteShardError`).

A single-frame shard has nothing to gain and is decompressed whole, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import zstandard

from .decompression import ZSTD, IncompleteShardError
from .errors import DataError, ShardChanged
from .row_runs import misaligned

#: (decompressed frame bytes) of frame ``k``.
FrameReader = Callable[[int], bytes]


def read_frame(path: str, frames: np.ndarray, k: int) -> bytes:
    """Decompress frame ``k`` (row ``k`` of the ``frames`` table) of the shard at ``path``.

    Raises ``OSError`` for an unreadable file, :class:`DataError` for a shorter one and
    :class:`IncompleteShardError` when the frame does not decode to its recorded length.
    """
    offset, length, _, size = (int(v) for v in frames[k])
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) < length:
        raise DataError(
            f"shard {path} is shorter than when it was indexed (file changed while in use; "
            "restart the server after modifying data)"
        )
    dec = zstandard.ZstdDecompressor().decompressobj()
    try:
        out = dec.decompress(data)
    except zstandard.ZstdError as exc:
        raise IncompleteShardError(
            path, ZSTD, f"corrupt: zstd frame {k + 1} (at byte {offset}): {exc}"
        ) from exc
    if not dec.eof or dec.unused_data or len(out) != size:
        raise IncompleteShardError(
            path,
            ZSTD,
            f"zstd frame {k + 1} (at byte {offset}) no longer decodes to the {size} bytes it "
            f"was indexed with (got {len(out)})",
        )
    return out


def frame_rows(
    path: str,
    starts: np.ndarray,
    frames: np.ndarray,
    idx: np.ndarray,
    frame: FrameReader,
    limit: int | None,
) -> list[bytes | int]:
    """Rows ``idx`` as bytes, joined from the frames holding them (``frame(k)`` gives frame
    ``k``'s content); a row longer than ``limit`` comes back as its size (an ``int``) and
    its frames are not read for it.

    Every row read is checked to be a line of this content, as plain JSONL rows are
    (:func:`.row_runs.misaligned`, raised as ``ShardChanged``): no newline inside it, one
    right after it (but at the end of the content), and one right before it when that byte
    is in a frame already read (a row starting a frame is not worth a frame more)."""
    lo = starts[idx]
    hi = starts[idx + 1] - 1
    begins = frames[:, 2]
    first = np.searchsorted(begins, lo, side="right") - 1
    last = np.searchsorted(begins, np.maximum(hi - 1, lo), side="right") - 1
    out: list[bytes | int] = []
    for a, b, f0, f1 in zip(lo.tolist(), hi.tolist(), first.tolist(), last.tolist()):
        if limit is not None and b - a > limit:
            out.append(b - a)
            continue
        if b <= a:
            out.append(b"")
            continue
        pieces = []
        for k in range(f0, f1 + 1):
            base = int(begins[k])
            content = frame(k)
            pieces.append(content[max(a - base, 0) : min(b - base, len(content))])
        row = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if (
            b"\n" in row
            or not _newline_at(b, f1, begins, frame)
            or (a > begins[f0] and frame(f0)[a - 1 - int(begins[f0])] != 10)
        ):
            raise ShardChanged(misaligned(path, a, b))  # other data: never skipped
        out.append(row)
    return out


def _newline_at(at: int, k: int, begins: np.ndarray, frame: FrameReader) -> bool:
    """Whether content byte ``at`` is a newline, or the content ends before it (a last line
    without one); it is in frame ``k`` or, at that frame's end, in the next."""
    content = frame(k)
    offset = at - int(begins[k])
    if offset < len(content):
        return content[offset] == 10
    return k + 1 >= len(begins) or frame(k + 1)[:1] in (b"\n", b"")
