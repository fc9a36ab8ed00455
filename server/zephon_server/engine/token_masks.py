"""Loss masks: which tokens of a text overlap its trained byte ranges.

A token is trained (mask 1) when its UTF-8 bytes ``[start, end)`` overlap a trained range
``[lo, hi)``: ``start < hi`` and ``max(end, start + 1) > lo`` (a token of no bytes counts as
its start byte). :func:`token_mask` applies that to one text's offsets, for any tokenizer.

For a tokenizer whose tokens tile the text (:mod:`.token_offsets`: a byte-level BPE, or the
byte tokenizer) :func:`encode_masks` does a whole micro-batch at once, without per-token
offsets: the texts' tokens laid end to end have non-decreasing starts and ends, so the tokens
a range covers are one run, found by binary search, and the runs of every range of every text
are marked together. A text whose tokens do not tile it (its lengths do not add up, or the
tokenizer normalises to NFC and the text is not in NFC) falls back to the tokenizer's offsets
and :func:`token_mask`; without a normalizer, any text's tokens tile it. Both give exactly
the same masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np

from .token_offsets import tiled_size

MASK_DTYPE = np.uint8
#: Trained byte ranges ``[lo, hi)`` of one text.
Ranges = Sequence[tuple[int, int]]


def token_mask(offsets: np.ndarray, ranges: Ranges) -> np.ndarray:
    """1 for every token whose bytes (``offsets``: ``[n, 2]`` start, end) overlap a trained
    range (an empty token counts as its start byte), else 0."""
    mask = np.zeros(len(offsets), dtype=MASK_DTYPE)
    if not ranges or not len(offsets):
        return mask
    starts = offsets[:, 0]
    ends = np.maximum(offsets[:, 1], starts + 1)
    for lo, hi in ranges:
        mask[(starts < hi) & (ends > lo)] = 1
    return mask


def encode_masks(
    tokenizer: Any, texts: Sequence[str], ranges: Sequence[Ranges]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Ids (int32) and loss mask of each text, its trained byte ranges given."""
    table = getattr(tokenizer, "byte_lengths", None)
    if table is None:
        return [
            (ids, token_mask(offsets, r))
            for (ids, offsets), r in zip(tokenizer.encode_offsets(texts), ranges)
        ]
    ids = tokenizer.encode_batch(texts)
    masks = tiled_masks(ids, texts, ranges, table, getattr(tokenizer, "lengths_need_nfc", True))
    out = []
    for i, mask in enumerate(masks):
        if mask is None:  # the tokens do not tile this text: the tokenizer's offsets
            text_ids, offsets = tokenizer.encode_offsets([texts[i]])[0]
            out.append((text_ids, token_mask(offsets, ranges[i])))
        else:
            out.append((ids[i], mask))
    return out


def tiled_masks(
    ids: Sequence[np.ndarray],
    texts: Sequence[str],
    ranges: Sequence[Ranges],
    table: np.ndarray,
    nfc: bool = True,
) -> list[np.ndarray | None]:
    """The mask of each text whose tokens tile it (bytes per id in ``table``; ``nfc``: only
    texts already in NFC can), None for the others (module docstring)."""
    n = len(ids)
    if not n:
        return []
    counts = np.fromiter(map(len, ids), dtype=np.int64, count=n)
    firsts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=firsts[1:])
    lengths = table[np.concatenate(ids)] if firsts[-1] else np.zeros(0, dtype=np.int64)
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)  # bounds[k]: byte where token k starts
    np.cumsum(lengths, out=bounds[1:])
    base = bounds[firsts]  # byte where each text starts, texts laid end to end
    sizes = np.fromiter(map(tiled_size, texts, repeat(nfc, n)), dtype=np.int64, count=n)
    tiles = (base[1:] - base[:-1]) == sizes
    lows, highs, owners = [], [], []
    for i in np.flatnonzero(tiles).tolist():
        offset = int(base[i])
        for lo, hi in ranges[i]:
            lows.append(lo + offset)
            highs.append(hi + offset)
            owners.append(i)
    mask = np.zeros(len(lengths), dtype=MASK_DTYPE)
    if owners:
        starts = bounds[:-1]
        ends = np.maximum(bounds[1:], starts + 1)  # non-decreasing, as the starts are
        who = np.asarray(owners, dtype=np.int64)
        first = np.maximum(np.searchsorted(ends, np.asarray(lows), side="right"), firsts[who])
        last = np.minimum(np.searchsorted(starts, np.asarray(highs), side="left"), firsts[who + 1])
        kept = last > first
        edges = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.add.at(edges, first[kept], 1)
        np.add.at(edges, last[kept], -1)
        mask[np.cumsum(edges[:-1]) > 0] = 1
    return [mask[firsts[i] : firsts[i + 1]] if ok else None for i, ok in enumerate(tiles.tolist())]
