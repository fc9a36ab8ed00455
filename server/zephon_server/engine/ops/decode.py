"""``decode_text``: JSON lines and Parquet values to ``{"text": str}``.

A malformed record (bad JSON, not an object, missing or non-string text field, invalid
UTF-8) follows its dataset's ``on_error`` policy: ``fail`` raises a :class:`DataError` naming
the file and line (or row), ``skip`` replaces the record by a tombstone (reason
``malformed``) so the document is still closed exactly once and the skip is counted.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import DataError
from ..records import SampleRecord
from .base import OpContext, Operator


class DecodeText(Operator):
    """Decodes fetched rows into text, applying each dataset's malformed-record policy."""

    op_name = "decode_text"
    default_microbatch_size = 128

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._datasets = ctx.datasets

    def process_many(self, elems: list[Any]) -> list[Any]:
        out = []
        loads = json.loads
        for rec in elems:
            payload = rec.payload
            info = self._datasets[rec.meta.dataset_id]
            field = info.spec.text_field
            problem = None
            text: Any = None
            if "raw" in payload:
                try:
                    obj = loads(payload["raw"])
                except UnicodeDecodeError as exc:
                    problem = f"invalid UTF-8 ({exc.reason} at byte {exc.start})"
                except ValueError as exc:
                    problem = f"bad JSON ({exc})"
                else:
                    if not isinstance(obj, dict):
                        problem = f"expected a JSON object, got {type(obj).__name__}"
                    elif field not in obj:
                        problem = f"missing text field {field!r} (fields: {sorted(obj)[:8]})"
                    else:
                        text = obj[field]
            else:
                text = payload.get("text")
                if text is None:
                    problem = f"missing text field {field!r} (null value)"
            if problem is None and not isinstance(text, str):
                problem = f"text field {field!r} is {type(text).__name__}, not a string"
            if problem is None and not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    problem = "invalid UTF-8 (lone surrogate in text)"
            if problem is None:
                out.append(SampleRecord({"text": text}, rec.meta))
                continue
            if info.spec.on_error == "skip":
                out.append(rec.tombstone("malformed"))
                continue
            doc = rec.meta.doc
            shard = info.shards[doc.shard]
            where = f"row {doc.row}" if shard.format == "parquet" else f"line {doc.row + 1}"
            raise DataError(
                f"dataset {info.spec.name!r}: {shard.path}:{where}: {problem}; fix the record or "
                f"set on_error: skip on dataset {info.spec.name!r} to skip and count such records"
            )
        return out
