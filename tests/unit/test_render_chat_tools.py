"""A record's tool definitions reach its chat template (``render_chat.tools_field``).

Function-calling data (the OpenAI fine-tuning format, Hugging Face's
``apply_chat_template(tools=...)``) carries the tools a conversation may call beside its
messages; Qwen3's real template writes them in the system turn. They were dropped without a
word: the model saw calls to tools nobody had described. These tests pin that they are
rendered where the template writes them, never trained, part of a skeleton's shape, and that
a malformed ``tools`` field is a data error.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import Counting, decode, render_rows, trained_runs
from zephon_server.engine.chat_layout import check_messages, layout_chat
from zephon_server.engine.chat_skeleton import Skeletons
from zephon_server.engine.chat_template import find_template
from zephon_server.engine.config import ConfigError
from zephon_server.engine.errors import DataError
from zephon_server.engine.ops.render_chat import RenderChat

pytestmark = pytest.mark.timeout(120)

QWEN3 = Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3" / "tokenizer.json"
DAY = datetime.date(2025, 1, 1)


def tool(name: str, description: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


WEATHER = [tool("get_weather", "The weather in a city.")]
BOTH = [*WEATHER, tool("get_time", 'The time in a city, "local".')]


def conversation(city: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    messages = [
        {"role": "user", "content": f"Weather in {city}?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18C"},
        {"role": "assistant", "content": f"It is 18C in {city}."},
    ]
    return {"messages": messages} if tools is None else {"messages": messages, "tools": tools}


@pytest.fixture(scope="module")
def qwen3() -> str:
    if not QWEN3.exists():
        pytest.fail(f"{QWEN3} is missing: run `make tokenizers` (`make test` does)")
    return str(QWEN3)


def test_a_records_tools_are_written_by_the_template_and_never_trained(qwen3):
    op = RenderChat(tokenizer=qwen3)
    bare, with_tools = render_rows(op, [conversation("Paris"), conversation("Paris", BOTH)])
    text = decode(op, with_tools.payload["input_ids"])
    template = op.chat_template.with_tools(BOTH)
    assert text == template.render(conversation("Paris")["messages"])
    assert "<tools>" in text and json.dumps(BOTH[1], ensure_ascii=False) in text
    assert "<tools>" not in decode(op, bare.payload["input_ids"])
    runs = [
        trained_runs(op, r.payload["input_ids"], r.payload["loss_mask"]) for r in (bare, with_tools)
    ]
    assert runs[0] == runs[1]  # the definitions are prompt: nothing more is trained
    assert not any("get_time" in run for run in runs[1])


def test_records_with_other_tools_are_other_shapes_and_lay_out_as_rendered(qwen3):
    tpl = Counting(find_template(qwen3, None), date=DAY)
    records = [
        conversation(city, tools)
        for tools in (WEATHER, BOTH, None)
        for city in ("Paris", "Oslo", "Lima")
    ]
    skeletons = Skeletons(tpl)

    def layouts(sk: Any) -> list[Any]:
        return [
            layout_chat(tpl, r["messages"], "assistant", sk, None, r.get("tools")) for r in records
        ]

    plain = layouts(None)
    assert layouts(skeletons) == plain
    assert len(skeletons._cache) == 3  # one shape per set of tools
    tpl.renders = 0
    assert layouts(skeletons) == plain
    assert tpl.renders == 0  # traced with their tools: written without rendering
    assert len({p.text.split("<|im_start|>user")[0] for p in plain}) == 3


@pytest.mark.parametrize(
    ("tools", "got"),
    [("get_weather", "got str"), ([1, 2], "got a list with non-objects"), ({"a": 1}, "got dict")],
)
def test_tools_that_are_not_a_list_of_objects_are_a_chat_error(qwen3, tools, got):
    op = RenderChat(tokenizer=qwen3)
    record = {**conversation("Paris"), "tools": tools}
    with pytest.raises(DataError, match=f"field 'tools' must be a list of tool definitions.*{got}"):
        render_rows(op, [record])


def test_tools_field_names_its_own_field(qwen3):
    op = RenderChat(tokenizer=qwen3, tools_field="functions")
    record = conversation("Paris")
    record["functions"] = WEATHER
    text = decode(op, render_rows(op, [record])[0].payload["input_ids"])
    assert '"get_weather"' in text.split("<|im_start|>user")[0]
    with pytest.raises(ConfigError, match="tools_field must name"):
        RenderChat(tokenizer=qwen3, tools_field="messages")


def test_the_skeleton_cache_holds_a_bounded_number_of_characters(qwen3, monkeypatch):
    from zephon_server.engine import chat_skeleton

    monkeypatch.setattr(chat_skeleton, "MAX_CACHE_CHARS", 40_000)
    tpl = Counting(find_template(qwen3, None), date=DAY)
    skeletons = Skeletons(tpl)
    for n in range(12):  # each set of tools about 6,000 characters, written in the skeleton
        tools = [tool(f"tool_{n}_{k}", "x" * 1000) for k in range(5)]
        record = conversation("Paris", tools)
        layout_chat(tpl, record["messages"], "assistant", skeletons, None, tools)
        assert skeletons._held == sum(skeletons._weights.values()) <= 40_000
    assert 2 <= len(skeletons._cache) < 12  # the oldest went first
    assert list(skeletons._weights) == list(skeletons._cache)


def test_records_with_tools_render_by_the_configs_tool_use_template(tmp_path):
    # A tokenizer config may name its templates; Hugging Face renders a record with tools by
    # the one named "tool_use" (when there is one) and every other by "default".
    from tests.support.chat_helpers import CHATML, chat_tokenizer

    tool_use = (
        "{% if tools %}<|im_start|>system\nTOOLS: {{ tools | tojson }}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<call>{{ c.function | tojson }}</call>{% endfor %}"
        "<|im_end|>\n{% endfor %}"
    )
    named = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": tool_use}]
    op = RenderChat(tokenizer=chat_tokenizer(tmp_path / "named", "chatml", chat_template=named))
    plain = RenderChat(tokenizer=chat_tokenizer(tmp_path / "plain", "chatml"))
    assert op.params()["template"] != plain.params()["template"]  # tool_use is in the identity
    rows = [conversation(city, WEATHER) for city in ("Paris", "Oslo", "Lima", "Rome")]
    # No tools (and no calls, which the default template would leave out): the default.
    rows.append({"messages": conversation("Bern")["messages"][-2:]})
    outs = render_rows(op, rows)  # the shape of the first four: built, traced, then filled
    texts = [decode(op, out.payload["input_ids"]) for out in outs]
    for row, text in zip(rows, texts):
        template = op.chat_template.with_tools(row.get("tools"))
        assert text == template.render(check_messages(row["messages"], "messages", 100))
    assert all(t.startswith('<|im_start|>system\nTOOLS: [{"type": "function"') for t in texts[:4])
    assert "TOOLS" not in texts[4]  # no tools: the default template
    bound = op.chat_template.with_tools(WEATHER)
    skeleton = op.skeletons.get(check_messages(rows[0]["messages"], "messages", 100), bound)
    assert skeleton is not None and skeleton.checks is not None  # traced by its own template
    assert len(op.skeletons._tracers) == 2
    runs = [trained_runs(op, o.payload["input_ids"], o.payload["loss_mask"]) for o in outs]
    call = '<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call><|im_end|>'
    assert runs[0] == [call, "It is 18C in Paris.<|im_end|>"] and "TOOLS" not in str(runs)
