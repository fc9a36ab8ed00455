"""A dataset's ``record_columns``: Parquet chat data kept in several columns (TRL's
``prompt`` and ``completion``; ``messages`` beside ``tools``) is read as one record per row,
rendered exactly as the same records in JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import chat_tokenizer
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_jsonl, write_parquet
from zephon_server.engine.errors import ConfigError, DataError

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return chat_tokenizer(tmp_path_factory.mktemp("tok") / "chatml")


def documents(dataset: dict[str, Any], tokenizer: str, **op: Any) -> dict[int, tuple]:
    """row -> (ids, loss mask) of every document of a one-dataset render_chat pipeline."""
    data = {
        "lanes": 1,
        "chunk_size": 4,
        "datasets": [{"name": "sft", "weight": 1.0, **dataset}],
        "pipeline": [
            {"render_chat": {"tokenizer": tokenizer, **op}},
            {"batch": {"microbatch_size": 1, "drop_last": False}},
        ],
    }
    pipe, execution = parse_config(data)
    out = {}
    run = pipe.run(execution)
    for batch in run.batches():
        pad = batch.tensors["padding_mask"][0]
        (meta,) = batch.rows
        ids = batch.tensors["input_ids"][0][pad].tolist()
        out[meta.doc.row] = (ids, batch.tensors["loss_mask"][0][pad].tolist())
    out[-1] = dict(run.tombstones)  # type: ignore[assignment]
    return out


def pairs(n: int) -> list[dict[str, Any]]:
    convs = generate_conversations(n, seed=7)
    return [
        {"prompt": c["messages"][-2]["content"], "completion": c["messages"][-1]["content"]}
        for c in convs
    ]


def test_prompt_and_completion_columns_render_as_the_jsonl_records(tmp_path, tokenizer):
    rows = pairs(20)
    write_jsonl(tmp_path / "js" / "pc.jsonl", rows)
    write_parquet(
        tmp_path / "pq" / "pc.parquet",
        [{"id": i, **r, "source": "x"} for i, r in enumerate(rows)],
        row_group_size=6,
    )
    jsonl = documents({"path": str(tmp_path / "js")}, tokenizer)
    parquet = documents(
        {"path": str(tmp_path / "pq"), "record_columns": ["prompt", "completion"]}, tokenizer
    )
    assert len(jsonl) == 21 and parquet == jsonl  # 20 documents and the (empty) tombstones
    # conversational prompt/completion (lists of messages) in two list columns, too
    convs = generate_conversations(12, seed=8)
    rows2 = [{"prompt": c["messages"][:-1], "completion": c["messages"][-1:]} for c in convs]
    write_jsonl(tmp_path / "js2" / "pc.jsonl", rows2)
    write_parquet(tmp_path / "pq2" / "pc.parquet", rows2, row_group_size=5)
    columns = {"path": str(tmp_path / "pq2"), "record_columns": ["prompt", "completion"]}
    assert documents(columns, tokenizer) == documents({"path": str(tmp_path / "js2")}, tokenizer)


def test_messages_and_tools_columns_render_as_the_jsonl_records(tmp_path):
    qwen3 = (
        Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3" / "tokenizer.json"
    )
    if not qwen3.exists():
        pytest.fail(f"{qwen3} is missing: run `make tokenizers` (`make test` does)")
    convs = generate_conversations(10, seed=3)
    rows = [{"messages": c["messages"], "tools": TOOLS} for c in convs]
    write_jsonl(tmp_path / "js" / "t.jsonl", rows)
    write_parquet(tmp_path / "pq" / "t.parquet", rows, row_group_size=4)
    jsonl = documents({"path": str(tmp_path / "js")}, str(qwen3))
    parquet = documents(
        {"path": str(tmp_path / "pq"), "record_columns": ["messages", "tools"]}, str(qwen3)
    )
    assert len(jsonl) == 11 and parquet == jsonl
    # the tools reach the template: without the column the tokens differ
    alone = documents({"path": str(tmp_path / "pq"), "record_columns": ["messages"]}, str(qwen3))
    assert len(alone) == 11 and alone != jsonl


def test_a_shard_without_a_record_column_is_refused_at_start_up(tmp_path, tokenizer):
    rows = pairs(4)
    write_parquet(tmp_path / "a.parquet", rows)
    write_parquet(tmp_path / "b.parquet", [{"prompt": r["prompt"]} for r in rows])
    dataset = {"path": str(tmp_path), "record_columns": ["prompt", "completion"]}
    with pytest.raises(DataError) as info:
        documents(dataset, tokenizer)
    text = str(info.value)
    assert "1 of its 2 Parquet shards (4 rows) has no text column 'completion'" in text
    assert "b.parquet" in text and "set the dataset's record_columns" in text


def test_a_value_over_max_document_bytes_in_any_column_skips_its_row(tmp_path, tokenizer):
    rows = pairs(5)
    rows[2]["completion"] = "y" * 5000
    write_parquet(tmp_path / "pc.parquet", rows)
    dataset = {
        "path": str(tmp_path),
        "record_columns": ["prompt", "completion"],
        "max_document_bytes": 4096,
        "on_error": "skip",
    }
    got = documents(dataset, tokenizer)
    assert sorted(k for k in got if k >= 0) == [0, 1, 3, 4]
    assert got[-1][("sft", "too_large")] == 1


def test_record_columns_are_checked(tmp_path, tokenizer):
    for bad in ("prompt", [], ["prompt", "prompt"], ["prompt", ""]):
        with pytest.raises(ConfigError, match="record_columns must be a list of distinct"):
            parse_config(
                {
                    "datasets": [{"name": "d", "path": "x", "weight": 1.0, "record_columns": bad}],
                    "pipeline": [{"tokenize": {}}, {"batch": {}}],
                }
            )
    data = {
        "datasets": [{"name": "d", "path": str(tmp_path), "weight": 1.0, "record_columns": ["a"]}],
        "pipeline": [{"tokenize": {}}, {"batch": {}}],
    }
    pipe, execution = parse_config(data)
    with pytest.raises(ConfigError, match="record_columns make a record of several Parquet"):
        pipe.plan(execution)


def test_a_text_dataset_cannot_also_read_record_columns(tmp_path, tokenizer):
    data = {
        "datasets": [
            {"name": "d", "path": str(tmp_path), "weight": 1.0, "record_columns": ["a", "b"]}
        ],
        "pipeline": [
            {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["d"]}},
            {"batch": {}},
        ],
    }
    pipe, execution = parse_config(data)
    with pytest.raises(ConfigError, match=r"is in render_chat\.text_datasets, whose records are"):
        pipe.plan(execution)
