"""Helpers for checking ``render_chat`` against ``transformers``' ``apply_chat_template``
(tests/unit/test_render_chat_reference.py and its service-tier twin)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import transformers

from tests.support.chat_helpers import render_rows as render
from zephon_server.engine.ops.render_chat import RenderChat
from zephon_server.engine.records import SampleRecord

REAL = Path(__file__).resolve().parents[2] / "build" / "tokenizers"
QWEN3 = REAL / "qwen3"
#: Llama 3's templates write the day they render on (``strftime_now``, which Hugging Face
#: evaluates to today); ``render_chat`` writes its ``date`` option (default 2025-01-01).
LLAMA_DATE = {"date_string": "01 Jan 2025"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


def reference(path: Path, **overrides: Any) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(path), **overrides)


def hf_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's messages as ``render_chat`` reads them (a null content, beside tool calls,
    is the empty content)."""
    messages = copy.deepcopy(record["messages"])
    for message in messages:
        if message.get("content") is None:
            message["content"] = ""
    return messages


def hf_ids(tok: Any, record: dict[str, Any], **variables: Any) -> list[int]:
    """``apply_chat_template``'s ids for a record (``variables``: more template variables)."""
    extra = {"tools": record["tools"]} if "tools" in record else {}
    out = tok.apply_chat_template(
        hf_messages(record), tokenize=True, add_generation_prompt=False, **extra, **variables
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def assert_same_ids(
    op: RenderChat, tok: Any, records: list[dict[str, Any]], **variables: Any
) -> None:
    outputs = render(op, [json.dumps(r).encode() for r in records])
    differing = []
    for i, (record, out) in enumerate(zip(records, outputs)):
        assert type(out) is SampleRecord and not out.meta.tombstone, (i, record)
        if out.payload["input_ids"].tolist() != hf_ids(tok, record, **variables):
            differing.append(i)
    assert not differing, f"{len(differing)} of {len(records)} differ, first {differing[:5]}"


def real(name: str) -> tuple[RenderChat, Any]:
    """render_chat and the reference on a real tokenizer fetched by ``make tokenizers``."""
    path = REAL / name
    if not (path / "tokenizer.json").exists():
        pytest.fail(f"{path} is missing: run `bash tools/fetch-tokenizers.sh build/tokenizers`")
    return RenderChat(tokenizer=str(path / "tokenizer.json")), reference(path)
