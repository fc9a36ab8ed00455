"""The batch operator's row stacking (``pad_rows``): padded and ragged rows."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_server.engine.ops.batch import pad_rows


def reference(rows, length, fill):
    out = np.full((len(rows), length), fill, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_rows_of_the_full_length_are_stacked_as_they_are(dtype):
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 2, 16).astype(dtype) for _ in range(5)]
    out = pad_rows("input_ids", rows, 16, pad_id=9)
    assert out.dtype == np.dtype(dtype) and out.shape == (5, 16)
    np.testing.assert_array_equal(out, reference(rows, 16, 9))
    rows[0][0] = not rows[0][0] if dtype is np.bool_ else rows[0][0] + 1
    assert out[0, 0] != rows[0][0]  # a copy: later changes to a row do not reach the batch


def test_ragged_rows_are_padded_with_the_fill_of_their_tensor():
    rows = [np.arange(n, dtype=np.int32) for n in (3, 7, 1)]
    np.testing.assert_array_equal(pad_rows("input_ids", rows, 7, 5), reference(rows, 7, 5))
    np.testing.assert_array_equal(pad_rows("labels", rows, 7, 5), reference(rows, 7, -100))
    np.testing.assert_array_equal(pad_rows("positions", rows, 7, 5), reference(rows, 7, 0))


def test_mixed_dtypes_keep_the_first_rows_dtype():
    rows = [np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int64)]
    out = pad_rows("input_ids", rows, 4, 0)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, reference(rows, 4, 0))
