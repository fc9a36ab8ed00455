"""``render_chat`` against ``transformers``' ``apply_chat_template`` on tool-calling records
under Qwen2.5's and Llama 3.2's real templates (the unit tier's twin holds the quicker cases;
this one loads two more tokenizers and runs 480 records: over a second of CPU)."""

from __future__ import annotations

from tests.support.chat_reference import LLAMA_DATE, TOOLS, assert_same_ids, real
from zephon_server.engine.chat_corpus import generate_conversations


def test_qwen2_5_and_llama3_2_with_tool_calls_equal_apply_chat_template():
    # Both templates leave an empty content of a tool-calling turn out of the text (Llama
    # 3.2's leaves out any content of such a turn: those turns keep an empty one here).
    records = generate_conversations(240, seed=19, mean_words=25, tool_calls=True)
    for record in records[::2]:
        record["tools"] = TOOLS
    assert_same_ids(*real("qwen2_5"), records)
    for record in records:
        for message in record["messages"]:
            if message.get("tool_calls"):
                message["content"] = None
    assert_same_ids(*real("llama3_2"), records, **LLAMA_DATE)
