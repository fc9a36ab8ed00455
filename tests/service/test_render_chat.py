"""``render_chat``: the test that needs worker processes (the YAML chat pipeline on every
runner).

The hermetic tests of the same topic are in ``tests/unit/test_render_chat.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.unit.test_render_chat import (
    chain_digests,
)
from zephon_server.engine.execution import ExecutionConfig

pytestmark = pytest.mark.timeout(120)


@pytest.mark.processes
def test_yaml_chat_pipeline_is_identical_on_every_runner(tmp_path, tok_dirs):
    from zephon_server.engine.chat_corpus import write_chat_corpus

    write_chat_corpus(tmp_path / "chat", conversations=300, shards=2, seed=2)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "seed": 7,
                "lanes": 2,
                "chunk_size": 16,
                "flush_every_k_chunks": 2,
                "datasets": [{"name": "chat", "path": "chat", "weight": 1.0}],
                "pipeline": [
                    {"render_chat": {"tokenizer": tok_dirs["chatml"], "train_on": "assistant"}},
                    {"pack_flat": {"max_length": 256}},
                    {"batch": {"microbatch_size": 4}},
                ],
            }
        )
    )
    from zephon_server.engine.config import load_config

    pipe, _ = load_config(config)
    oracle = chain_digests(pipe, ExecutionConfig(runner="inline"))
    assert len(oracle) == 2 and all(len(v) >= 5 for v in oracle.values())
    for runner, workers in (("threads", 3), ("processes", 2)):
        pipe, _ = load_config(config)
        assert chain_digests(pipe, ExecutionConfig(runner=runner, workers=workers)) == oracle
    assert "render_chat(" in pipe.explain() and "decode_text" not in pipe.explain()


def test_resume_of_a_chat_pipeline_at_every_step_equals_uninterrupted(tmp_path, tok_dirs):
    """Checkpoint a render_chat + pack_flat + shuffle + batch run at every seq; each resume
    continues with exactly the batches of the uninterrupted run."""
    from tests.support.builders import lane_chains
    from zephon_server.engine.chat_corpus import write_chat_corpus
    from zephon_server.engine.checkpoint import ResumeState
    from zephon_server.engine.datasets import DatasetSpec
    from zephon_server.engine.pipeline import Pipeline
    from zephon_server.engine.run import PipelineRun

    write_chat_corpus(tmp_path / "chat", conversations=80, shards=2, seed=3)
    spec = DatasetSpec("chat", str(tmp_path / "chat"), 1.0)
    pipe = Pipeline([spec], seed=3, lanes=2, chunk_size=8, flush_every_k_chunks=2)
    pipe.render_chat(tokenizer=tok_dirs["chatml"], train_on="last_assistant")
    pipe.pack_flat(max_length=192).shuffle(buffer_size=4).batch(microbatch_size=2)
    full_run = PipelineRun(pipe.plan(ExecutionConfig(runner="inline")))
    full = lane_chains(full_run)
    assert all(len(v) >= 4 for v in full.values())
    for cut in range(max(len(v) for v in full.values()) + 1):
        positions = {lane: min(cut, len(v)) for lane, v in full.items()}
        state = ResumeState.decode(full_run.checkpoint(positions).encode())
        plan = pipe.plan(ExecutionConfig(runner="threads", workers=2))
        resumed = lane_chains(PipelineRun(plan, resume=state))
        for lane, seqs in full.items():
            assert resumed[lane] == seqs[positions[lane] :], (cut, lane)


@pytest.mark.processes
def test_tool_calling_chats_are_identical_on_every_runner(tmp_path):
    # Qwen3's real template, conversations whose tool-calling turns have an empty, a null or a
    # worded content, mixed: the shapes (empty contents included) are learned per worker in
    # whatever order records arrive, and no order may change a mask. The calls' names and
    # arguments are tool texts (slots, some JSON-escaped), so records share shapes and most
    # are written without rendering, on whichever worker traced their shape.
    convs = []
    for i in range(120):
        arguments = {"id": i % 2, "query": f'item "{i}"\n'}
        call = {"type": "function", "function": {"name": f"lookup{i}", "arguments": arguments}}
        # Every other record defines its tools (written in the system turn, never trained).
        tools = [{"type": "function", "function": {"name": f"lookup{i % 3}"}}] if i % 2 else None
        convs.append(
            {
                "messages": [
                    {"role": "user", "content": f"Find item {i}."},
                    {
                        "role": "assistant",
                        "content": ("", None, f"Looking {i}.")[i % 3],
                        "tool_calls": [call],
                    },
                    {"role": "tool", "content": f"item {i} is blue"},
                    {"role": "assistant", "content": f"Item {i} is blue."},
                ],
                "tools": tools,
            }
        )
    run = run_on_every_runner(tmp_path, convs)
    tok = run.plan.pipeline.ops[0].tokenizer
    call, answer = tok.token_id("<tool_call>"), tok.token_id("<tool_response>")
    calls = untrained = defined = 0
    for batch in run.batches():
        ids, mask = batch.tensors["input_ids"], batch.tensors["loss_mask"]
        assert not mask[ids == answer].any()
        calls += int(mask[ids == call].sum())
        untrained += int((ids == call).sum()) - int(mask[ids == call].sum())
        for row, row_mask in zip(ids, mask):
            defined += tok.decode(row.tolist()).count("<tools>")
            assert "<tools>" not in tok.decode(row[row_mask == 1].tolist())
    assert calls == 120  # every call written is trained, whatever its turn's content
    # Qwen3 writes the tools of the 60 records defining some in their system turn (naming
    # <tools> and <tool_call> twice each), untrained.
    assert defined == untrained == 120
    assert not [reason for (_, reason) in run.tombstones if reason.startswith(("chat", "mask"))]


@pytest.mark.processes
def test_reasoning_chats_are_identical_on_every_runner(tmp_path):
    # Qwen3's real template: one-turn chats with a reasoning, two-turn chats whose first
    # reasoning the template leaves out, chats without one. Each conversation with a reasoning
    # is a shape of its own; every written think block is trained, the empty ones never.
    convs = []
    for i in range(120):
        reasoning = (f"Think about {i}.", None, f"\nStep {i}.\n")[i % 3]
        turns = [("user", f"Item {i}?"), ("assistant", f"Item {i} is blue.")]
        if i % 4 == 0:
            turns = [("user", "Hi."), ("assistant", "Hello."), *turns]
        messages = [{"role": role, "content": text} for role, text in turns]
        for message in messages[1::2]:
            message["reasoning_content"] = reasoning
        convs.append({"messages": messages})
    run = run_on_every_runner(tmp_path, convs)
    tok = run.plan.pipeline.ops[0].tokenizer
    think, end = tok.token_id("<think>"), tok.token_id("</think>")
    trained = untrained = 0
    for batch in run.batches():
        ids, mask = batch.tensors["input_ids"], batch.tensors["loss_mask"]
        assert np.array_equal(mask[ids == think], mask[ids == end])  # a block is trained whole
        trained += int(mask[ids == think].sum())
        untrained += int((ids == think).sum()) - int(mask[ids == think].sum())
    assert (trained, untrained) == (80, 40)  # every reasoning written once; empty blocks not
    assert not [reason for (_, reason) in run.tombstones if reason.startswith(("chat", "mask"))]


def run_on_every_runner(tmp_path: Path, convs: list[dict[str, Any]]) -> Any:
    """A Qwen3 chat pipeline over ``convs``: its chain digests on the threads x3 and processes
    x2 runners are asserted equal to the inline runner's; returns an inline run to inspect."""
    from zephon_server.engine.config import parse_config
    from zephon_server.engine.corpus import write_jsonl

    qwen3 = Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3"
    if not (qwen3 / "tokenizer.json").exists():
        pytest.fail(f"{qwen3} is missing: run `make tokenizers` (`make test` does)")
    write_jsonl(tmp_path / "chat" / "chats.jsonl", convs)
    config = {
        "seed": 5,
        "lanes": 2,
        "chunk_size": 8,
        "flush_every_k_chunks": 2,
        "end_of_data": "longest",  # every conversation delivered, so every one is counted
        "datasets": [{"name": "chat", "path": str(tmp_path / "chat"), "weight": 1.0}],
        "pipeline": [
            {"render_chat": {"tokenizer": str(qwen3 / "tokenizer.json")}},
            {"pack_flat": {"max_length": 256}},
            {"batch": {"microbatch_size": 2}},
        ],
    }
    pipe, _ = parse_config(config)
    oracle = chain_digests(pipe, ExecutionConfig(runner="inline"))
    batches = sum(len(v) for v in oracle.values())
    assert len(oracle) == 2 and batches >= 10
    for runner, workers in (("threads", 3), ("processes", 2)):
        pipe, _ = parse_config(config)
        assert chain_digests(pipe, ExecutionConfig(runner=runner, workers=workers)) == oracle
    return parse_config(config)[0].run(ExecutionConfig(runner="inline"))


@pytest.mark.processes
def test_parquet_conversations_mixed_with_text_are_identical_on_every_runner(tmp_path, tok_dirs):
    """Hugging Face's ``messages: list<struct<role, content>>`` Parquet column (values that
    cross to worker processes as lists of dicts) beside a JSONL text dataset trained whole
    (``text_datasets``) and prompt/completion columns (``record_columns``), mixed by trained
    tokens: the same batches on every runner."""
    from zephon_server.engine.chat_corpus import generate_conversations
    from zephon_server.engine.config import parse_config
    from zephon_server.engine.corpus import write_jsonl, write_parquet

    convs = generate_conversations(160, seed=12)
    for shard in range(2):
        rows = [{"messages": c["messages"]} for c in convs[shard::2]]
        write_parquet(tmp_path / "chat" / f"part-{shard}.parquet", rows, row_group_size=16)
    texts = [{"text": f"web page {i}: " + "a quiet harbor town " * (1 + i % 7)} for i in range(120)]
    write_jsonl(tmp_path / "web" / "web.jsonl", texts)
    pairs = [
        {"prompt": f"q{i}: " + c["messages"][-2]["content"], "completion": "a"}
        for i, c in enumerate(convs)
    ]
    write_parquet(tmp_path / "pc" / "pc.parquet", pairs, row_group_size=32)
    data = {
        "seed": 3,
        "lanes": 2,
        "chunk_size": 8,
        "datasets": [
            {
                "name": "chat",
                "path": str(tmp_path / "chat"),
                "weight": 3.0,
                "text_field": "messages",
            },
            {"name": "web", "path": str(tmp_path / "web"), "weight": 1.0},
            {
                "name": "pc",
                "path": str(tmp_path / "pc"),
                "weight": 1.0,
                "record_columns": ["prompt", "completion"],
            },
        ],
        "pipeline": [
            {"render_chat": {"tokenizer": tok_dirs["chatml"], "text_datasets": ["web"]}},
            {"ensure_mixture": {"by": "loss_tokens"}},
            {"pack_flat": {"max_length": 256, "emit_labels": True}},
            {"batch": {"microbatch_size": 4}},
        ],
    }

    def digests(runner: str, workers: int) -> dict[int, list[str]]:
        pipe, _ = parse_config(data)
        chains: dict[int, list[str]] = {}
        trained = 0
        for batch in pipe.run(ExecutionConfig(runner=runner, workers=workers)).batches():
            chains.setdefault(batch.lane_id, []).append(batch.chain_digest.hex())
            trained += int(batch.tensors["loss_mask"].sum())
            seen.update(span.doc.dataset for row in batch.rows for span in row.spans)
        assert trained > 0
        return chains

    seen: set[int] = set()

    oracle = digests("inline", 1)
    assert len(oracle) == 2 and all(len(v) >= 5 for v in oracle.values())
    assert seen == {0, 1, 2}  # every dataset reached the batches
    assert digests("threads", 3) == oracle
    assert digests("processes", 2) == oracle
