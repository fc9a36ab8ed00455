"""The synthetic chat corpora the tests and benchmarks use (``engine/chat_corpus.py``): the
same seed gives the same conversations, with reasoning or tool calls added on request."""

from __future__ import annotations

import json

from tests.support.chat_helpers import decode
from tests.support.chat_helpers import render_rows as render
from zephon_server.engine.ops.render_chat import RenderChat


def test_chat_corpus_is_deterministic_and_its_template_is_chatml(tmp_path):
    from zephon_server.engine.chat_corpus import write_chat_corpus, write_chatml_template

    first = write_chat_corpus(tmp_path / "a", conversations=50, shards=2, seed=4)
    second = write_chat_corpus(tmp_path / "b", conversations=50, shards=2, seed=4)
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    rows = [json.loads(line) for p in first for line in p.read_text().splitlines()]
    assert len(rows) == 50 and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    template = write_chatml_template(tmp_path / "chatml.jinja")
    op = RenderChat(tokenizer="byte", template=str(template))
    (out,) = render(op, [rows[0]])
    text = decode(op, out.payload["input_ids"])
    assert text == "".join(
        f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in rows[0]["messages"]
    )


def test_a_reasoning_corpus_is_the_same_conversations_with_a_reasoning_per_answer():
    from zephon_server.engine.chat_corpus import generate_conversations

    plain = generate_conversations(30, seed=4, mean_words=20)
    reasoning = generate_conversations(30, seed=4, mean_words=20, reasoning_words=50)
    assert plain == generate_conversations(30, seed=4, mean_words=20, reasoning_words=0)
    assert reasoning == generate_conversations(30, seed=4, mean_words=20, reasoning_words=50)
    for a, b in zip(plain, reasoning):
        assert [m["content"] for m in a["messages"]] == [m["content"] for m in b["messages"]]
        thoughts = [m.get("reasoning_content") for m in b["messages"]]
        roles = [m["role"] for m in b["messages"]]
        assert all((t is not None) == (r == "assistant") for t, r in zip(thoughts, roles))
        assert all(len(t.split()) > 5 for t in thoughts if t is not None)


def test_a_tool_calling_corpus_calls_a_tool_before_every_other_answer():
    from zephon_server.engine.chat_corpus import generate_conversations

    plain = generate_conversations(30, seed=4, mean_words=20)
    tools = generate_conversations(30, seed=4, mean_words=20, tool_calls=True)
    assert tools == generate_conversations(30, seed=4, mean_words=20, tool_calls=True)
    contents = set()
    exchanges = called = 0
    for a, b in zip(plain, tools):
        calls = [m for m in b["messages"] if "tool_calls" in m]
        assert [m for m in b["messages"] if "tool_calls" not in m and m["role"] != "tool"] == (
            a["messages"]
        )
        exchanges += sum(m["role"] == "user" for m in a["messages"])
        called += len(calls)
        for call in calls:
            following = b["messages"][b["messages"].index(call) + 1]
            assert following["role"] == "tool" and following["content"]
            contents.add(call["content"])
    assert contents == {"", None, "Let me check that."}
    assert called == (exchanges + 1) // 2  # exchanges 0, 2, 4, ... of the corpus
