"""Parquet text columns: checking that the column is text, the byte size of each value, and the
values of a string column holding invalid UTF-8."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DataError


def value_sizes(column: Any, values: list[Any]) -> np.ndarray:
    """Bytes of each value of a string/binary column (UTF-8 length for text, 0 for nulls)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        return np.asarray(pc.binary_length(column).fill_null(0).to_numpy(), dtype=np.int64)
    except pa.ArrowNotImplementedError:  # e.g. string_view columns
        return np.array(
            [0 if v is None else len(v.encode() if isinstance(v, str) else v) for v in values],
            dtype=np.int64,
        )


def text_or_bytes(column: Any) -> list[Any]:
    """The values of a string column holding invalid UTF-8: each valid one as text (as
    ``to_pylist`` gives it), each invalid one as its bytes, which ``decode_text`` (or
    ``render_chat``) turns into that record's own ``malformed`` problem, naming its row."""
    import pyarrow as pa

    out: list[Any] = []
    for value in column.cast(pa.large_binary()).to_pylist():
        try:
            out.append(value if value is None else value.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(value)
    return out


def check_field(path: str, schema: Any, text_field: str) -> None:
    import pyarrow as pa

    names = list(schema.names)
    if text_field not in names:
        raise DataError(
            f"Parquet shard {path} has no column {text_field!r}; columns are {names} "
            "(set the dataset's text_field to one of them)"
        )
    typ = schema.field(text_field).type
    is_view = getattr(pa.types, "is_string_view", None)
    if not (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or (is_view is not None and is_view(typ))
    ):
        raise DataError(
            f"Parquet shard {path}: column {text_field!r} has type {typ}, expected a string "
            "or binary column (set text_field to a text column)"
        )
