"""``render_chat`` over Parquet: a column of JSON records, Hugging Face's list<struct>
messages column, and the column checks and size bounds of list values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import chat_tokenizer
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_jsonl
from zephon_server.engine.errors import DataError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory) -> dict[str, str]:
    return {"chatml": chat_tokenizer(tmp_path_factory.mktemp("chat-tok") / "chatml", "chatml")}


def test_parquet_column_of_json_conversations(tmp_path, tok_dirs):
    """A Parquet dataset whose ``text_field`` column holds each record as JSON text renders
    exactly like the same records in JSONL."""
    from zephon_server.engine.corpus import write_parquet

    convs = generate_conversations(24, seed=4)
    write_parquet(
        tmp_path / "pq" / "chat.parquet",
        [{"conversation": json.dumps(c), "id": i} for i, c in enumerate(convs)],
        row_group_size=8,
    )
    write_jsonl(tmp_path / "js" / "chat.jsonl", convs)

    def rows(path: Path, **dataset: Any) -> dict[int, tuple[list[int], list[int]]]:
        data = {
            "lanes": 1,
            "chunk_size": 8,
            "datasets": [{"name": "chat", "path": str(path), "weight": 1.0, **dataset}],
            "pipeline": [
                {"render_chat": {"tokenizer": tok_dirs["chatml"]}},
                {"batch": {"microbatch_size": 3, "drop_last": False}},
            ],
        }
        pipe, execution = parse_config(data)
        out = {}
        for batch in pipe.run(execution).batches():
            pad = batch.tensors["padding_mask"]
            for i, meta in enumerate(batch.rows):
                ids = batch.tensors["input_ids"][i][pad[i]].tolist()
                out[meta.doc.row] = (ids, batch.tensors["loss_mask"][i][pad[i]].tolist())
        return out

    parquet = rows(tmp_path / "pq", text_field="conversation")
    assert len(parquet) == 24 and parquet == rows(tmp_path / "js")
    # Hugging Face's layout: messages as list<struct<role, content>>, read as it is.
    write_parquet(
        tmp_path / "hf" / "chat.parquet",
        [{"messages": c["messages"], "id": i} for i, c in enumerate(convs)],
        row_group_size=8,
    )
    assert rows(tmp_path / "hf", text_field="messages") == parquet


def test_a_list_column_is_refused_at_start_up_without_render_chat(tmp_path):
    from zephon_server.engine.corpus import write_parquet

    convs = generate_conversations(4, seed=4)
    write_parquet(tmp_path / "chat.parquet", [{"messages": c["messages"]} for c in convs])
    data = {
        "datasets": [
            {"name": "chat", "path": str(tmp_path), "weight": 1.0, "text_field": "messages"}
        ],
        "pipeline": [{"tokenize": {"tokenizer": "byte"}}, {"batch": {}}],
    }
    pipe, execution = parse_config(data)
    with pytest.raises(DataError) as refused:
        pipe.plan(execution)
    text = str(refused.value)
    assert "no text column 'messages' (a string or binary column)" in text
    assert "a list column is read by render_chat" in text


def test_an_oversized_list_value_is_skipped_by_its_size_never_converted(tmp_path, tok_dirs):
    from zephon_server.engine.corpus import write_parquet

    long = {"role": "assistant", "content": "x" * 5000}
    rows = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]] * 3
    rows.insert(1, [{"role": "user", "content": "q"}, long])
    write_parquet(tmp_path / "chat.parquet", [{"messages": m} for m in rows])
    data = {
        "lanes": 1,
        "datasets": [
            {
                "name": "chat",
                "path": str(tmp_path),
                "weight": 1.0,
                "text_field": "messages",
                "max_document_bytes": 4096,
                "on_error": "skip",
            }
        ],
        "pipeline": [
            {"render_chat": {"tokenizer": tok_dirs["chatml"]}},
            {"batch": {"microbatch_size": 1, "drop_last": False}},
        ],
    }
    pipe, execution = parse_config(data)
    run = pipe.run(execution)
    got = sorted(row.doc.row for batch in run.batches() for row in batch.rows)
    assert got == [0, 2, 3] and dict(run.tombstones)[("chat", "too_large")] == 1
