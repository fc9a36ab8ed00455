"""Parquet text columns: checking that the column is text, decoding a dictionary-encoded one,
the byte size of each value, and its values as Python objects.

A value's size is taken from the Arrow buffers before anything is converted, so a value over
the dataset's ``max_document_bytes`` is never made into a Python object (it would cost its
size again, plus the cache's copy): it is reported as oversized from its size alone.

Whether a column is text is decided on its Arrow type *as a string* (:func:`text_type`), the
form the shard index keeps (:data:`Columns`): the check at start-up from a catalog
(:mod:`.text_columns`) and the one of every read (:func:`check_field`) are one rule.

A pipeline that reads whole records (``render_chat``) also takes a list or struct column
(``records``): Hugging Face's chat datasets keep ``messages`` as ``list<struct<role,
content>>``. Such a value's size is the bytes of its strings plus 8 for every other scalar
(:func:`nested_sizes`), also taken from the Arrow buffers.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .errors import DataError

#: A Parquet file's top-level columns: (name, Arrow type as ``str(field.type)``), in order.
Columns = tuple[tuple[str, str], ...]

_TEXT_TYPES = frozenset(("string", "large_string", "string_view", "binary", "large_binary"))
_DICTIONARY = re.compile(r"dictionary<values=(.*), indices=\w+, ordered=[01]>")
_RECORD_TYPES = ("list<", "large_list<", "fixed_size_list<", "struct<")
#: What a value of a column must be, in the words of the messages (by ``records``).
EXPECTED = {
    False: "a string or binary column",
    True: "a string or binary column, or a list or struct column such as messages",
}


def plain(column: Any) -> Any:
    """``column`` with a dictionary-encoded text column (a pandas Categorical, pyarrow's
    ``dictionary_encode``) decoded to its value type, so its texts are the plain column's."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column


def value_sizes(column: Any) -> np.ndarray:
    """Bytes of each value of a plain string/binary column (UTF-8 length for text, 0 for
    nulls), from its Arrow buffers: no value is converted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if record_type(str(column.type)):
        return nested_sizes(column)
    try:
        return np.asarray(pc.binary_length(column).fill_null(0).to_numpy(), dtype=np.int64)
    except pa.ArrowNotImplementedError:  # string_view / binary_view columns
        sizes = [_view_sizes(chunk) for chunk in column.chunks]
        return np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)


def nested_sizes(column: Any) -> np.ndarray:
    """Bytes of each value of a list or struct column (chunked or not): its strings' bytes
    plus 8 per other scalar, 0 for nulls; from the Arrow buffers, nothing converted."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    sizes = [_array_sizes(chunk) for chunk in chunks]
    return np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)


def _array_sizes(array: Any) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = array.type
    if pa.types.is_dictionary(typ):
        return _array_sizes(array.cast(typ.value_type))
    if pa.types.is_struct(typ):
        total = np.zeros(len(array), dtype=np.int64)
        for child in array.flatten():  # aligned with the rows, the struct's offset applied
            total += _array_sizes(child)
        if array.null_count:
            total[array.is_null().to_numpy(zero_copy_only=False)] = 0
        return total
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        values = array.flatten()  # the items of the non-null lists, in order
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        weights = _array_sizes(values).astype(np.float64)
        found = np.bincount(parents, weights=weights, minlength=len(array))
        return np.rint(found).astype(np.int64)
    if text_type(str(typ)):
        return np.asarray(pc.binary_length(array).fill_null(0).to_numpy(), dtype=np.int64)
    sizes = np.full(len(array), 8, dtype=np.int64)
    if array.null_count:
        sizes[array.is_null().to_numpy(zero_copy_only=False)] = 0
    return sizes


def _view_sizes(chunk: Any) -> np.ndarray:
    """Value lengths of a string_view / binary_view array: each 16-byte view starts with its
    length (int32, little-endian)."""
    views = np.frombuffer(chunk.buffers()[1], dtype="<i4").reshape(-1, 4)
    sizes = views[chunk.offset : chunk.offset + len(chunk), 0].astype(np.int64)
    if chunk.null_count:
        sizes[chunk.is_null().to_numpy(zero_copy_only=False)] = 0
    return sizes


def column_values(column: Any, limit: int | None) -> tuple[list[Any], np.ndarray, int]:
    """(values, sizes, bytes) of a plain text column: each value as ``to_pylist`` gives it
    (see :func:`text_or_bytes` for invalid UTF-8), None for nulls and, never converted, for
    a value over ``limit`` bytes; each value's size (:func:`value_sizes`); the Arrow bytes of
    the values kept."""
    import pyarrow as pa

    sizes = value_sizes(column)
    over = sizes > limit if limit is not None else None
    if over is None or not over.any():
        return _python(column), sizes, int(column.nbytes)
    kept = np.flatnonzero(~over)
    values: list[Any] = [None] * len(sizes)
    for i, value in zip(kept.tolist(), _python(column.take(pa.array(kept)))):
        values[i] = value
    return values, sizes, int(column.nbytes) - int(sizes[over].sum())


def _python(column: Any) -> list[Any]:
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:  # pyarrow does not check a string column's UTF-8
        return text_or_bytes(column)


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


def schema_columns(schema: Any) -> Columns:
    """The top-level columns of an Arrow schema: (name, type string) of each field."""
    return tuple((str(field.name), str(field.type)) for field in schema)


def text_type(type_name: str) -> bool:
    """Whether an Arrow type (its string) is text: string (large and view variants too) or
    binary (large too), or a dictionary of such values."""
    found = _DICTIONARY.fullmatch(type_name)
    return (found.group(1) if found else type_name) in _TEXT_TYPES


def record_type(type_name: str) -> bool:
    """Whether an Arrow type (its string) is a list or struct: a value a pipeline reading
    whole records (``render_chat``) takes as it is."""
    return type_name.startswith(_RECORD_TYPES)


def value_type(type_name: str, records: bool) -> bool:
    """Whether a column of this type can be read: text, or with ``records`` a list or struct."""
    return text_type(type_name) or (records and record_type(type_name))


def column_type(columns: Columns, name: str) -> str | None:
    """The type (string) of column ``name`` of ``columns``, or None when there is none."""
    return next((typ for column, typ in columns if column == name), None)


def is_text_column(columns: Columns, text_field: str, records: bool = False) -> bool:
    """Whether a file with ``columns`` has ``text_field`` as a column of text (with
    ``records``, or of lists or structs): what :func:`check_field` accepts."""
    typ = column_type(columns, text_field)
    return typ is not None and value_type(typ, records)


def check_field(path: str, schema: Any, text_field: str, records: bool = False) -> None:
    """:class:`DataError` unless ``text_field`` is a column of text (:func:`text_type`), or
    with ``records`` of lists or structs."""
    names = list(schema.names)
    if text_field not in names:
        raise DataError(
            f"Parquet shard {path} has no column {text_field!r}; columns are {names} "
            "(set the dataset's text_field to one of them)"
        )
    typ = str(schema.field(names.index(text_field)).type)
    if not value_type(typ, records):
        hint = "" if records or not record_type(typ) else "; a chat dataset needs render_chat"
        raise DataError(
            f"Parquet shard {path}: column {text_field!r} has type {typ}, expected "
            f"{EXPECTED[records]} (set text_field to "
            f"{'such a column' if records else 'a text column'}{hint})"
        )
