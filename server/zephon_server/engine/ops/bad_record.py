"""One record that cannot be read, decoded or tokenized, under its dataset's ``on_error``.

Every per-record failure in ``fetch``, ``decode_text`` and ``tokenize`` ends here, so the
policy is applied in one place and the messages read alike: ``fail`` raises a
:class:`DataError` naming the dataset, the file and line (JSONL) or row (Parquet), the
problem and the fix; ``skip`` replaces the record by a tombstone with a reason from
:data:`~zephon_server.engine.run.SKIP_REASONS`, so the document is still closed exactly once
and the skip is counted.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError
from ..records import SampleRecord

SKIP_FIX = "set on_error: skip on dataset {name!r} to skip and count such records"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` (just ``Type`` when the message is empty, as for MemoryError)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def tokenizer_problem(text: Any, exc: BaseException) -> str:
    """What to say of a text the tokenizer failed on: a lone surrogate, named where it is (a
    JSON escape such as ``\\ud800`` without its pair is valid JSON but not Unicode, and no
    tokenizer takes it), else the tokenizer's own error."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as bad:
            return (
                f"the text holds a lone surrogate (U+{ord(text[bad.start]):04X} at character "
                f"{bad.start}: a JSON escape such as \\ud800 without its pair), which is not "
                "valid Unicode and which no tokenizer takes"
            )
    return f"the tokenizer failed on this record ({describe_exception(exc)})"


def location(info: Any, doc: Any) -> str:
    """``path:line N`` (JSONL, 1-based) or ``path:row N`` (Parquet, 0-based) of a document."""
    shard = info.shards[doc.shard]
    where = f"row {doc.row}" if shard.format == "parquet" else f"line {doc.row + 1}"
    return f"{shard.path}:{where}"


def on_bad_record(
    rec: SampleRecord, info: Any, reason: str, problem: str, fix: str = "fix the record"
) -> SampleRecord:
    """The tombstone replacing ``rec`` under ``on_error: skip``; raises under ``fail``.

    ``info`` is the record's resolved dataset, ``reason`` the tombstone reason, ``problem``
    what is wrong with the record and ``fix`` the first remedy the message offers.
    """
    if info.spec.on_error == "skip":
        return rec.tombstone(reason)
    name = info.spec.name
    raise DataError(
        f"dataset {name!r}: {location(info, rec.meta.doc)}: {problem}; {fix} or "
        + SKIP_FIX.format(name=name)
    )
