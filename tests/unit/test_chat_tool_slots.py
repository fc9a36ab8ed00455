"""Tool texts are slots of a chat skeleton: tool-calling records share shapes.

Each tool call's name, arguments and id (:mod:`zephon_server.engine.chat_slots`) is a slot,
written verbatim or JSON-escaped inside ``tojson``; these tests pin that the layouts are those
of the renderings (texts and trained ranges, on Qwen3's real template and on templates that
write tool texts raw, escaped with ``ensure_ascii`` or dump whole messages), that records
differing only in their tool texts share one shape and are written without rendering, and
that what a trace cannot follow is rendered.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import Counting
from zephon_server.engine.chat_layout import ChatError, check_messages, layout_chat
from zephon_server.engine.chat_skeleton import Misplaced, Skeletons, place
from zephon_server.engine.chat_slots import shape_of, tool_texts
from zephon_server.engine.chat_template import ChatTemplate, TemplateSource, find_template

QWEN3 = Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3" / "tokenizer.json"
DAY = datetime.date(2025, 1, 1)
#: Writes each call's name and id raw and its arguments through tojson, and a tool turn's id.
RAW = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[{{ c.id }}:{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}]{% endfor %}"
    "{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}</{{ m.role }}>\n{% endfor %}"
)
#: Escapes non-ASCII in its arguments: a marker escaped, so nothing can be filled.
ASCII = RAW.replace("tojson", "tojson(ensure_ascii=True)")
#: Writes contents (and calls) as JSON: an escaped assistant content is not verbatim, so
#: never attributed (nor traced); another turn's trains as written under train_on: all.
DUMP = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content | tojson }}"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}"
)


def template(name: str) -> Counting:
    if name == "qwen3":
        if not QWEN3.exists():
            pytest.fail(f"{QWEN3} is missing: run `make tokenizers` (`make test` does)")
        return Counting(find_template(str(QWEN3), None), date=DAY)
    text = {"raw": RAW, "ascii": ASCII, "dump": DUMP}[name]
    return Counting(TemplateSource(text, "test", {"eos_token": "</s>"}), date=DAY)


#: Argument values that JSON escapes, or not; plain ones first.
VALUES = ("weather in Paris", 'say "hi"', "two\nlines", "back\\slash", "Zürich ✓", "tab\there")


def call(k: int, name: str, arguments: Any, with_id: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": f"call_{k:04d}", **out} if with_id else out


def conversation(k: int, arguments: str = "dict") -> list[dict[str, Any]]:
    """A tool-calling exchange: one or two calls, contents empty, null or worded, arguments a
    mapping (nested, with numbers) or a JSON string, ids on some."""
    value = VALUES[k % len(VALUES)]
    args: Any = {"query": value, "limit": k % 3, "filter": {"lang": "en", "tags": [value, "x"]}}
    if arguments == "string":
        args = f'{{"query": "{k}"}}'
    with_id = k % 2 == 0
    calls = [call(k, ("search", "lookup")[k % 2], args, with_id)]
    if k % 4 == 3:
        calls.append(call(k + 1, "calculate", {"expression": f"{k} * 2"}, with_id))
    turn: dict[str, Any] = {"role": "assistant", "content": ("", None, "Checking.")[k % 3]}
    turn["tool_calls"] = calls
    answer: dict[str, Any] = {"role": "tool", "content": f"result {k}: {value}"}
    if with_id:
        answer["tool_call_id"] = f"call_{k:04d}"
    messages = [{"role": "user", "content": f"question {k}?"}, turn, answer]
    messages.append({"role": "assistant", "content": f"Answer {k}."})
    return check_messages(messages, "messages", 100)


def outcome(tpl: ChatTemplate, messages: Any, train_on: str, sk: Any) -> Any:
    try:
        return layout_chat(tpl, messages, train_on, sk)
    except ChatError as exc:
        return f"ChatError: {exc}"


@pytest.mark.parametrize("name", ["qwen3", "raw", "ascii", "dump"])
@pytest.mark.parametrize("train_on", ["assistant", "last_assistant", "all"])
def test_tool_slots_give_the_layouts_of_the_renderings(name, train_on):
    tpl = template(name)
    convs = [conversation(k) for k in range(36)] + [conversation(k, "string") for k in range(12)]
    plain = [outcome(tpl, m, train_on, None) for m in convs]
    # dump: a tool's answer JSON-escaped trains as written under "all" (not the model's turn)
    assert not [x for x in plain if isinstance(x, str)]
    if name == "dump":  # the model's own turn must be written verbatim
        escaped = [*convs[0][:3], {"role": "assistant", "content": 'say "hi"'}]
        assert "not written verbatim" in outcome(tpl, escaped, train_on, None)
    skeletons = Skeletons(tpl)
    for m in convs:  # shapes met, traced at their second meeting
        outcome(tpl, m, train_on, skeletons)
    tpl.renders = 0
    assert [outcome(tpl, m, train_on, skeletons) for m in convs] == plain
    if name in ("qwen3", "raw"):
        # Every record is written without rendering, escaped arguments included.
        assert tpl.renders == 0
        assert any('say \\"hi\\"' in x.text for x in plain)
        assert any("two\\nlines" in x.text for x in plain)
    else:  # an escaped marker (ensure_ascii), a content inside tojson: each one rendered
        assert tpl.renders >= len(convs)
        assert name == "dump" or any("\\u00fc" in x.text for x in plain)


def test_records_differing_in_tool_texts_share_a_shape():
    convs = [conversation(k) for k in range(0, 48, 12)]  # the same calls, other texts
    assert len({shape_of(m) for m in convs}) == 1
    assert tool_texts(convs[0])[:4] == ["call_0000", "search", "weather in Paris", "en"]
    other = conversation(0)
    other[1]["tool_calls"][0]["type"] = "retrieval"  # a type stays in the shape
    reordered = conversation(0)
    function = reordered[1]["tool_calls"][0]["function"]
    reordered[1]["tool_calls"][0]["function"] = dict(reversed(list(function.items())))
    numbers = conversation(0)
    numbers[1]["tool_calls"][0]["function"]["arguments"]["limit"] = 7  # a number too
    shapes = {shape_of(m) for m in (convs[0], other, reordered, numbers)}
    assert len(shapes) == 4


def test_a_trace_learns_which_tool_texts_are_escaped():
    tpl = template("qwen3")
    messages = conversation(1)
    skeletons = Skeletons(tpl)
    skeletons.get(messages)
    skeleton = skeletons.get(messages)  # met twice: traced
    assert skeleton is not None and skeleton.checks is not None
    n = len(messages)
    texts = tool_texts(messages)  # name, then the argument strings
    assert texts[0] == "lookup"
    assert skeleton.escaped == frozenset(range(2 * n + 1, 2 * n + len(texts)))


def test_place_takes_a_tool_text_verbatim_or_escaped_only_where_allowed():
    pieces = ['{"q": "', '"}']
    full = '{"q": "a\\"b"}'
    assert place(pieces, ['a"b'], full, [True]) == [(7, 11)]
    with pytest.raises(Misplaced):
        place(pieces, ['a"b'], full)  # a content is never taken escaped


def test_only_the_first_tool_texts_of_a_conversation_are_slots():
    from zephon_server.engine.chat_slots import MAX_TOOL_SLOTS

    def calls(names: list[str]) -> list[dict[str, Any]]:
        turn = {"role": "assistant", "content": "", "tool_calls": [{"name": n} for n in names]}
        return [{"role": "user", "content": "go"}, turn, {"role": "assistant", "content": "ok"}]

    names = [f"t{k}" for k in range(MAX_TOOL_SLOTS + 50)]
    first, late = list(names), list(names)
    first[0], late[-1] = "other", "other"
    assert len(tool_texts(calls(names))) == MAX_TOOL_SLOTS
    assert shape_of(calls(first)) == shape_of(calls(names))  # a slot
    assert shape_of(calls(late)) != shape_of(calls(names))  # past the bound: in the shape
    tpl = Counting(
        TemplateSource(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
            "{% for c in m.tool_calls or [] %}[{{ c.name }}]{% endfor %}\n{% endfor %}",
            "test",
        ),
        date=DAY,
    )
    skeletons = Skeletons(tpl)
    for messages in (calls(names), calls(first), calls(late), calls(first)):
        assert layout_chat(tpl, messages, "assistant", skeletons) == layout_chat(
            tpl, messages, "assistant", None
        )


def test_records_read_from_parquet_structs_lay_out_as_rendered():
    # A Parquet struct column gives every call every field, null where a record has none
    # (an id, arguments as a string or as a mapping), and lists where JSON has arrays.
    def record(k: int) -> list[dict[str, Any]]:
        function = {"name": f"f{k}", "arguments": None if k % 2 else f'{{"q": "{k}"}}'}
        call = {"id": None if k % 3 else f"c{k}", "type": "function", "function": function}
        turn = {"role": "assistant", "content": None, "tool_calls": [call], "tool_call_id": None}
        answer = {"role": "tool", "content": f"r{k}", "tool_calls": None, "tool_call_id": "c"}
        messages = [{"role": "user", "content": f"q{k}", "tool_calls": None, "tool_call_id": None}]
        messages += [turn, answer, {"role": "assistant", "content": f"a{k}"}]
        return check_messages(messages, "messages", 100)

    for name in ("qwen3", "raw"):
        tpl = template(name)
        convs = [record(k) for k in range(24)]
        plain = [outcome(tpl, m, "all", None) for m in convs]
        skeletons = Skeletons(tpl)
        for _ in range(2):
            assert [outcome(tpl, m, "all", skeletons) for m in convs] == plain
        assert len(skeletons._cache) <= 6  # null or not: the shapes, whatever the texts


def test_past_the_bound_the_shape_takes_the_tool_fields_in_slot_order():
    # One slot left when a message holding tool_call_id *before* tool_calls comes: the slot is
    # the first string of tool_calls (the order tool_texts takes), so the id stays in the shape
    # and two ids are two shapes (a shape key walking the record's order had made the id the
    # slot: one skeleton for both, filled with the first one's id).
    from zephon_server.engine.chat_slots import MAX_TOOL_SLOTS

    def calls(last_id: str) -> list[dict[str, Any]]:
        many = [{"name": f"t{k}"} for k in range(MAX_TOOL_SLOTS - 1)]
        first = {"role": "assistant", "content": "", "tool_calls": many}
        last = {"role": "assistant", "content": "", "tool_call_id": last_id}
        last["tool_calls"] = [{"name": "final"}]
        return [{"role": "user", "content": "go"}, first, last, {"role": "user", "content": "ok"}]

    a, b = calls("id-a"), calls("id-b")
    assert tool_texts(a)[-1] == "final"
    assert shape_of(a) != shape_of(b)
    tpl = Counting(
        TemplateSource(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
            "{% for c in m.tool_calls or [] %}[{{ c.name }}]{% endfor %}"
            "{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}\n{% endfor %}",
            "test",
        ),
        date=DAY,
    )
    skeletons = Skeletons(tpl)
    for messages in (a, a, b, a, b):
        assert layout_chat(tpl, messages, "all", skeletons) == layout_chat(
            tpl, messages, "all", None
        )
