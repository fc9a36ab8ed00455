"""A batch as text, as ``zephon tail`` and ``zephon dump --format decoded`` print it.

A header line (lane, seq, row count, tensor shapes), then one line per row with its tokens
decoded: with the server's built-in ``byte`` tokenizer ids below 256 are UTF-8 bytes and
other ids print as ``<id>``; with a ``tokenizer.json`` path that exists here and the
``tokenizers`` package installed, the Hugging Face tokenizer decodes them; otherwise the ids
are printed. Padding is skipped using ``padding_mask`` (True on tokens) or ``segment_ids`` (0
on padding) when the batch has them.

A batch with a ``loss_mask`` (chat and instruction pipelines) prints each row's documents on
lines of their own (from ``cu_seqlens``, else ``segment_ids``), every run of trained tokens
marked ``train:``: what the model learns, as it reaches the trainer. The runs of a document
are decoded as one text (:meth:`Detokenizer.pieces`), so a decoder that drops a text's
leading space, or a character whose bytes two runs share, shows as in the whole text.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, TextIO

import numpy as np

from .wire import DecodedBatch

BYTE_TOKENIZER = "byte"
_CONTEXT = 8  # tokens decoded before a run, so that the run decodes as inside the text
_PARTIAL = "\ufffd"  # what a decoder shows for the bytes of a character cut short


class Detokenizer:
    """Shows ids: as the quoted text ``text`` decodes them to, or as the ids when ``text``
    is None (no tokenizer here)."""

    def __init__(self, text: Callable[[list[int]], str] | None) -> None:
        self.text = text

    def __call__(self, ids: list[int]) -> str:
        return _ids_text(ids) if self.text is None else repr(self.text(ids))

    def pieces(self, ids: list[int], bounds: Sequence[int]) -> list[str]:
        """How ``ids[a:b]`` shows for each pair of consecutive ``bounds``, each run decoded
        after up to :data:`_CONTEXT` tokens before it and keeping only what it adds: a leading
        space a decoder drops at the start of a text stays, and a character split between
        two runs shows whole in the run that completes it."""
        if self.text is None:
            return [_ids_text(ids[a:b]) for a, b in pairwise(bounds)]
        decode = self.text
        out = []
        last = len(bounds) - 2
        for k, (a, b) in enumerate(pairwise(bounds)):
            before = decode(ids[max(0, a - _CONTEXT) : a]).rstrip(_PARTIAL) if a else ""
            whole = decode(ids[max(0, a - _CONTEXT) : b])
            if not whole.startswith(before):  # a decoder that rewrites earlier text
                out.append(repr(decode(ids[a:b])))
                continue
            out.append(
                repr(whole[len(before) :] if k == last else whole[len(before) :].rstrip(_PARTIAL))
            )
        return out


def detokenizer(spec: str) -> Detokenizer:
    """How to show ids (quoted text, or the ids) given the server's tokenizer spec."""
    if spec == BYTE_TOKENIZER:
        return Detokenizer(byte_decode)
    if spec and os.path.isfile(spec):
        try:
            # Optional dependency, imported by name so the client installs without it.
            tokenizers: Any = importlib.import_module("tokenizers")
        except ImportError:
            return Detokenizer(None)
        tokenizer = tokenizers.Tokenizer.from_file(spec)
        return Detokenizer(lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False)))
    return Detokenizer(None)


def print_batch(
    batch: DecodedBatch,
    out: TextIO,
    *,
    detokenize: Callable[[list[int]], str] | None = None,
    max_chars: int | None = None,
) -> None:
    """Print one batch: header with tensor shapes, then each row shown by ``detokenize`` (a
    :class:`Detokenizer`, or any function showing a list of ids)."""
    shapes = "  ".join(
        f"{name}{list(arr.shape)}:{arr.dtype.name}" for name, arr in sorted(batch.tensors.items())
    )
    rows = _row_count(batch)
    print(f"lane {batch.lane} seq {batch.seq}  rows={rows}  {shapes}", file=out)
    if detokenize is None or "input_ids" not in batch.tensors:
        return
    ids = batch.tensors["input_ids"]
    if ids.ndim == 1:
        ids = ids[None, :]
    keep = _token_mask(batch.tensors, ids.shape)
    trained = _shaped(batch.tensors, "loss_mask", ids.shape)
    for row in range(ids.shape[0]):
        if trained is not None:
            _print_trained_row(batch.tensors, row, ids, keep, trained, out, detokenize, max_chars)
            continue
        row_ids = [int(v) for v in ids[row][keep[row]]]
        print(f"  row {row}: {_cut(detokenize(row_ids), max_chars)}", file=out)


def _print_trained_row(
    tensors: dict[str, np.ndarray],
    row: int,
    ids: np.ndarray,
    keep: np.ndarray,
    trained: np.ndarray,
    out: TextIO,
    detokenize: Callable[[list[int]], str],
    max_chars: int | None,
) -> None:
    """A row with a ``loss_mask``: a line of counts, then one line per document in which each
    run of trained tokens is shown as ``train:`` and its text, the rest as its text alone."""
    documents = _documents(tensors, row, keep[row], ids.shape)
    mask = trained[row] != 0
    count = len(documents)
    print(
        f"  row {row}: {count} document{'' if count == 1 else 's'}, "
        f"{int(keep[row].sum())} tokens, {int(mask[keep[row]].sum())} trained",
        file=out,
    )
    for number, (start, end) in enumerate(documents):
        runs = _runs(mask[start:end])
        doc_ids = ids[row, start:end].tolist()
        if isinstance(detokenize, Detokenizer):
            shown = detokenize.pieces(doc_ids, [0, *(b for _, b in runs)])
        else:
            shown = [detokenize(doc_ids[a:b]) for a, b in runs]
        line = " ".join(
            ("train:" if mask[start + a] else "") + text for (a, _), text in zip(runs, shown)
        )
        print(f"    doc {number}: {_cut(line, max_chars)}", file=out)


def _documents(
    tensors: dict[str, np.ndarray], row: int, keep: np.ndarray, shape: tuple[int, ...]
) -> list[tuple[int, int]]:
    """The [start, end) token ranges of a row's documents: from ``cu_seqlens`` and
    ``num_docs`` when the batch has them, else where ``segment_ids`` changes, else the row's
    tokens as one document. Padding (``keep`` False) is in none."""
    cu = tensors.get("cu_seqlens")
    count = tensors.get("num_docs")
    if cu is not None and count is not None and cu.ndim == 2 and row < len(cu):
        bounds = [int(v) for v in cu[row][: int(count[row]) + 1]]
        return [(a, b) for a, b in pairwise(bounds) if b > a]
    segments = _shaped(tensors, "segment_ids", shape)
    labels = segments[row] if segments is not None else keep.astype(np.int64)
    return [(a, b) for a, b in _runs(labels) if keep[a]]


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) ranges of equal consecutive ``values``."""
    if not len(values):
        return []
    edges = [0, *(int(i) + 1 for i in np.flatnonzero(values[1:] != values[:-1])), len(values)]
    return list(pairwise(edges))


def _cut(text: str, max_chars: int | None) -> str:
    return text[:max_chars] + "..." if max_chars is not None and len(text) > max_chars else text


def _shaped(tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...]) -> Any:
    """Tensor ``name`` when the batch has it with ``shape`` (a row-per-token tensor), else None."""
    value = tensors.get(name)
    return value if value is not None and value.shape == shape else None


def byte_decode(ids: Sequence[int]) -> str:
    """The byte tokenizer's ids as text: runs of ids < 256 as UTF-8, others as ``<id>``."""
    parts: list[str] = []
    run = bytearray()
    for token in ids:
        if 0 <= token < 256:
            run.append(token)
            continue
        if run:
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
        parts.append(f"<{token}>")
    if run:
        parts.append(run.decode("utf-8", errors="replace"))
    return "".join(parts)


def _ids_text(ids: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, ids)) + "]"


def _token_mask(tensors: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """True on real tokens: ``padding_mask``, else ``segment_ids != 0``, else everything."""
    mask = _shaped(tensors, "padding_mask", shape)
    if mask is not None:
        return np.asarray(mask, dtype=bool)
    segments = _shaped(tensors, "segment_ids", shape)
    if segments is not None:
        return np.asarray(segments != 0)
    return np.ones(shape, dtype=bool)


def _row_count(batch: DecodedBatch) -> int:
    if batch.rows:
        return len(batch.rows)
    for arr in batch.tensors.values():
        return int(arr.shape[0]) if arr.ndim else 1
    return 0
