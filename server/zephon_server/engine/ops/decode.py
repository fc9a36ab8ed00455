"""``decode_text``: JSON lines and Parquet values to ``{"text": str}``.

A record that cannot be decoded follows its dataset's ``on_error`` policy
(:mod:`.bad_record`): bad JSON, not an object, a missing or non-string text field, invalid
UTF-8, and *any* exception the parser raises on one record (JSON nested too deeply for the
parser's recursion limit, a number too long to convert, memory) are that record's problem,
never the pipeline's: ``fail`` raises a :class:`DataError` naming the file and line (or row),
``skip`` replaces the record by a tombstone (reason ``malformed``) so the document is still
closed exactly once and the skip is counted.
"""

from __future__ import annotations

import json
from typing import Any

from ..json_line import loads_line
from ..records import SampleRecord
from .bad_record import describe_exception, on_bad_record
from .base import OpContext, Operator, OpTraits


def _text_of(payload: dict[str, Any], field: str) -> tuple[Any, str | None]:
    """(text, None) for a good record, (None, problem) for a malformed one."""
    if "raw" not in payload:
        text = payload.get("text")
        if text is None:
            return None, f"missing text field {field!r} (null value)"
    else:
        try:
            obj = loads_line(payload["raw"])
        except Exception as exc:  # any failure parsing one record is that record's problem
            return None, _parse_problem(exc) + _line_hint(payload["raw"])
        if not isinstance(obj, dict):
            return None, f"expected a JSON object, got {type(obj).__name__}"
        if field not in obj:
            return None, f"missing text field {field!r} (fields: {sorted(obj)[:8]})"
        text = obj[field]
    if isinstance(text, bytes):  # a Parquet binary value (or an invalid string one)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, _parse_problem(exc)
    if not isinstance(text, str):
        return None, f"text field {field!r} is {type(text).__name__}, not a string"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None, (
                "a lone surrogate in the text (a JSON escape such as \\ud800 without its "
                "pair): not valid Unicode"
            )
    return text, None


def _line_hint(raw: Any) -> str:
    """A hint for a row that is blank, or looks UTF-16 (or binary): NUL bytes in its first
    bytes."""
    head = bytes(raw[:64]) if isinstance(raw, bytes | bytearray | memoryview) else b""
    if isinstance(raw, bytes | bytearray | memoryview) and not bytes(raw).strip():
        return "; the line is blank: every line of a JSONL file is a record, so remove it"
    if b"\x00" in head or head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "; the line holds NUL bytes: is the file UTF-16 (or binary)? JSONL must be UTF-8"
    return ""


def _parse_problem(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8 ({exc.reason} at byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"bad JSON ({exc})"
    if isinstance(exc, RecursionError):
        return f"JSON nested too deeply to parse ({describe_exception(exc)})"
    return f"cannot parse the record ({describe_exception(exc)})"


class DecodeText(Operator):
    """Decodes fetched rows into text, applying each dataset's malformed-record policy."""

    op_name = "decode_text"
    default_microbatch_size = 128

    def traits(self) -> OpTraits:
        # Records leave in input order; count-based grouping: fusable with its neighbours.
        return OpTraits(preserves_cursor_order=True, fusable=True)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._datasets = ctx.datasets

    def process_many(self, elems: list[Any]) -> list[Any]:
        out = []
        for rec in elems:
            info = self._datasets[rec.meta.dataset_id]
            try:
                text, problem = _text_of(rec.payload, info.spec.text_field)
            except Exception as exc:  # whatever else fails on one record
                text, problem = None, f"cannot decode the record ({describe_exception(exc)})"
            if problem is None:
                out.append(SampleRecord({"text": text}, rec.meta))
            else:
                out.append(on_bad_record(rec, info, "malformed", problem))
        return out
