"""``loads_line`` (engine/json_line.py) gives exactly what ``json.loads`` gives, value or
exception, on every kind of row: plain, with whitespace around, BOMs, UTF-16, bad UTF-8,
lone surrogates, extra data, non-finite numbers, big integers, deep nesting."""

from __future__ import annotations

import codecs
import json

import pytest

from zephon_server.engine.json_line import loads_line

ROWS = [
    b'{"text": "hello", "n": 1}',
    b'{"messages": [{"role": "user", "content": "caf\xc3\xa9 \xe2\x9c\x93"}]}',
    b'  {"a": 1}',
    b'{"a": 1}  \r\n',
    b'{"a": 1}\t',
    b'{"a": 1} x',
    b'{"a": 1}{"b": 2}',
    b'{"a": 1',
    b"",
    b"1",
    b"12",
    b"[1, 2]",
    b'"x"',
    b"nul",
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',
    b'{"big": 123456789012345678901234567890, "f": 1e400, "neg": -0}',
    b'{"s": "\\ud800 lone"}',
    b'{"bad": "\xff\xfe"}',
    b'{"bad": "\xed\xa0\x80"}',
    b'{"dup": 1, "dup": 2}',
    codecs.BOM_UTF8 + b'{"a": 1}',
    '{"a": "utf16"}'.encode("utf-16"),
    '{"a": "utf16"}'.encode("utf-16-le"),
    '{"a": "utf32"}'.encode("utf-32-be"),
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a": 1}\x0b',
    '{"a": 1}\u3000'.encode(),
]


def outcome(fn, row):
    try:
        value = fn(row)
    except Exception as exc:  # the exception is the outcome compared
        return ("raises", type(exc), str(exc))
    return ("value", json.dumps(value, allow_nan=True), type(value))


@pytest.mark.parametrize("row", ROWS, ids=range(len(ROWS)))
def test_the_same_value_or_exception_as_json_loads(row):
    assert outcome(loads_line, row) == outcome(json.loads, row)


def test_text_rows_take_json_loads_as_well():
    assert loads_line('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(json.JSONDecodeError, match="Extra data"):
        loads_line('{"a": 1} 2')
