"""Tokens and trained (loss) tokens delivered per dataset, counted from the batches themselves.

A batch row's spans (``SampleMeta.spans``) lie on its tokens in order from position 0 (a
packed row's segments, or a tokenized record's one span), so span ``k`` of row ``i`` covers
``[offset_k, offset_k + length_k)`` of that row. Its tokens count for the span's dataset; its
*trained* tokens are the non-zero ``loss_mask`` entries in that range, or all of them when the
batch has no ``loss_mask`` (pretraining text: every token is trained). Padding is in no span,
so it is never counted.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .numbered_batch import NumberedBatch
from .records import SampleBatch


def count_batch_tokens(
    batch: SampleBatch | NumberedBatch, tokens: Counter[int], loss_tokens: Counter[int]
) -> None:
    """Add ``batch``'s tokens and trained tokens per dataset index to the two counters."""
    mask = batch.tensors.get("loss_mask")
    if mask is None or mask.ndim != 2 or mask.shape[0] != len(batch.rows):
        for meta in batch.rows:
            for span in meta.spans:
                tokens[span.doc.dataset] += span.length
                loss_tokens[span.doc.dataset] += span.length
        return
    width = mask.shape[1]
    datasets_in = {span.doc.dataset for meta in batch.rows for span in meta.spans}
    if len(datasets_in) == 1:  # the common case: each row's spans are its first tokens
        (dataset,) = datasets_in
        used = [sum(span.length for span in meta.spans) for meta in batch.rows]
        tokens[dataset] += sum(used)
        loss_tokens[dataset] += sum(
            int(np.count_nonzero(mask[i, : min(n, width)])) for i, n in enumerate(used)
        )
        return
    trained = np.zeros((mask.shape[0], width + 1), dtype=np.int64)
    np.cumsum(mask != 0, axis=1, out=trained[:, 1:])
    rows: list[int] = []
    starts: list[int] = []
    lengths: list[int] = []
    datasets: list[int] = []
    for i, meta in enumerate(batch.rows):
        offset = 0
        for span in meta.spans:
            rows.append(i)
            starts.append(offset)
            lengths.append(span.length)
            datasets.append(span.doc.dataset)
            offset += span.length
    if not rows:
        return
    begin = np.minimum(np.asarray(starts, dtype=np.int64), width)
    end = np.minimum(begin + np.asarray(lengths, dtype=np.int64), width)
    at = np.asarray(rows, dtype=np.int64)
    learned = trained[at, end] - trained[at, begin]
    which = np.asarray(datasets, dtype=np.int64)
    per_tokens = np.bincount(which, weights=np.asarray(lengths, dtype=np.float64))
    per_trained = np.bincount(which, weights=learned.astype(np.float64))
    for dataset in sorted(set(datasets)):
        tokens[dataset] += int(per_tokens[dataset])
        loss_tokens[dataset] += int(per_trained[dataset])
