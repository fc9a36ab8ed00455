"""Chat skeletons: conversations laid out without rendering, the same layout as without them.

The skeleton of a conversation shape (:mod:`zephon_server.engine.chat_skeleton`) replaces the
marker renderings of :func:`layout_chat`; these tests pin that it changes nothing but the
number of renderings, on every template the project tests (ChatML, Llama 3 style headers
that trim, [INST], Qwen3's real template), and that a template branching on contents falls
back to the conversation's own renderings.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import CHATML, HEADERS, INST, Counting
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.chat_layout import ChatError, layout_chat
from zephon_server.engine.chat_skeleton import Misplaced, Skeletons, place
from zephon_server.engine.chat_slots import shape_of
from zephon_server.engine.chat_template import ChatTemplate, TemplateSource, find_template

QWEN3 = Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3"
DAY = datetime.date(2025, 1, 1)
#: Branches on a content: the text *before* a message depends on what it says.
BRANCHING = (
    "{% for m in messages %}{% if m.content.startswith('!') %}[loud]{% endif %}"
    "<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
)


def template(text: str) -> Counting:
    return Counting(TemplateSource(text, "test", {"eos_token": "</s>"}), date=DAY)


def outcome(
    tpl: ChatTemplate,
    messages: list[dict[str, Any]],
    train_on: str,
    sk: Any,
    reasoning: str | None = None,
) -> Any:
    try:
        return layout_chat(tpl, messages, train_on, sk, reasoning)
    except ChatError as exc:
        return f"ChatError: {exc}"


def conversations() -> list[list[dict[str, Any]]]:
    convs = [c["messages"] for c in generate_conversations(60, seed=5, mean_words=12)]
    convs.append([{"role": "user", "content": "  padded  "}, {"role": "assistant", "content": ""}])
    convs.append([{"role": "user", "content": "ünïcödé ✓"}, {"role": "assistant", "content": "是"}])
    return convs


def qwen3_template() -> Counting:
    path = QWEN3 / "tokenizer.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make tokenizers` (`make test` does)")
    source = find_template(str(path), None)
    return Counting(source, date=DAY)


@pytest.mark.parametrize("name", ["chatml", "headers", "inst", "qwen3"])
@pytest.mark.parametrize("train_on", ["assistant", "last_assistant", "all"])
def test_skeletons_give_the_same_layouts_without_rendering(name, train_on):
    tpl = (
        qwen3_template()
        if name == "qwen3"
        else template({"chatml": CHATML, "headers": HEADERS, "inst": INST}[name])
    )
    convs = conversations()
    plain = [outcome(tpl, m, train_on, None) for m in convs]
    skeletons = Skeletons(tpl)
    for m in convs:  # the first meeting of each shape renders its skeleton
        outcome(tpl, m, train_on, skeletons)
    tpl.renders = 0
    cached = [outcome(tpl, m, train_on, skeletons) for m in convs]
    assert cached == plain
    errors = {x for x in plain if isinstance(x, str)}
    assert all("raise" in e or "alternate" in e for e in errors), errors
    assert bool(errors) == (name == "inst")  # [INST] refuses the generated system prompts
    # Once shapes are known, a conversation is rendered only when its contents answer the
    # template's questions differently from the markers (the padded turn that "headers" trims)
    # or its shape has no skeleton ([INST] refusing a system prompt renders to say so).
    failed = sum(isinstance(x, str) for x in plain)
    assert tpl.renders == {"chatml": 0, "qwen3": 0, "headers": 1, "inst": failed}[name]


def test_a_template_that_branches_on_contents_falls_back_to_its_own_renderings():
    tpl = template(BRANCHING)
    loud = [{"role": "user", "content": "!hey"}, {"role": "assistant", "content": "fine"}]
    quiet = [{"role": "user", "content": "hey"}, {"role": "assistant", "content": "fine"}]
    shouted = [{"role": "user", "content": "hey"}, {"role": "assistant", "content": "!no"}]
    skeletons = Skeletons(tpl)
    for messages in (quiet, loud, shouted, loud):
        assert outcome(tpl, messages, "assistant", skeletons) == outcome(
            tpl, messages, "assistant", None
        )
    got = layout_chat(tpl, loud, "assistant", skeletons)
    assert got.text.startswith("[loud]<user>!hey</user>")
    assert [got.text[a:b] for a, b in got.trained] == ["fine</assistant>"]
    assert "depending on its content" in outcome(tpl, shouted, "assistant", skeletons)


def test_shapes_are_roles_and_every_other_field_and_the_cache_is_bounded():
    base = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    named = [{"role": "user", "content": "a", "name": "x"}, {"role": "assistant", "content": "c"}]
    assert shape_of(base) == ("user", "assistant")
    assert shape_of(named)[0] == (json.dumps({"role": "user", "name": "x"}), False)
    assert shape_of(base) == shape_of([{**m, "content": "other"} for m in base])
    assert shape_of([base[0], {**base[1], "content": ""}]) == (
        "user",
        ('{"role": "assistant"}', True),
    )
    tpl = template(CHATML)
    skeletons = Skeletons(tpl, max_shapes=2)
    for n in range(1, 5):
        skeletons.get(base * n)
    assert len(skeletons._cache) == 2
    assert [len(k) for k in skeletons._cache] == [6, 8]  # the most recent shapes are kept


def test_no_role_passes_for_another_messages_fields_or_emptiness():
    # A role spelling out another message's fields, or an empty content, must not share its
    # shape: the skeleton would then write that other message's text.
    fields = json.dumps({"role": "user", "name": "x"})
    named = [{"role": "user", "content": "a", "name": "x"}, {"role": "assistant", "content": "b"}]
    posing = [{"role": fields, "content": "a"}, {"role": "assistant", "content": "b"}]
    empty = [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]
    shapes = {shape_of(m) for m in (named, posing, empty, [empty[0], {**empty[1], "content": "c"}])}
    assert len(shapes) == 4
    tpl = template("{% for m in messages %}<{{ m.role }}>{{ m.content }}|{% endfor %}")
    skeletons = Skeletons(tpl)
    for messages in (named, posing, empty, posing, named):
        assert layout_chat(tpl, messages, "assistant", skeletons) == layout_chat(
            tpl, messages, "assistant", None
        )


def test_a_shape_with_long_fields_is_laid_out_but_not_kept():
    tpl = template(CHATML)
    skeletons = Skeletons(tpl)
    long = {"role": "assistant", "content": "yes", "reasoning_content": "why " * 2000}
    messages = [{"role": "user", "content": "q"}, long]
    assert layout_chat(tpl, messages, "assistant", skeletons) == layout_chat(
        tpl, messages, "assistant", None
    )
    assert not skeletons._cache
    skeletons.get([{"role": "user", "content": "q"}, {**long, "reasoning_content": "short"}])
    assert len(skeletons._cache) == 1


def test_place_takes_the_trimmed_form_the_next_piece_follows():
    pieces = ["<a>", "</a><b>", "</b>"]
    cases = [  # contents, the rendering, the contents as written
        (["x ", "y"], "<a>x </a><b>y</b>", ["x ", "y"]),  # verbatim
        ([" x ", "y"], "<a>x</a><b>y</b>", ["x", "y"]),  # stripped (Jinja's trim)
        (["\nx ", " y\n"], "<a>x </a><b> y</b>", ["x ", " y"]),  # newlines stripped
        (["\nx ", "y"], "<a>x </a><b>y</b>", ["x ", "y"]),  # leading newlines (Qwen3's lstrip)
    ]
    for contents, full, written in cases:
        assert [full[a:b] for a, b in place(pieces, contents, full)] == written
    with pytest.raises(Misplaced) as bad:  # verbatim, then other text: the next piece differs
        place(pieces, ["x", "y"], "<a>x!</a><b>y</b>")
    assert (bad.value.why, bad.value.k) == ("around", 1)


def reasoning_conversations() -> list[list[dict[str, Any]]]:
    """Conversations whose assistant turns carry a reasoning, none, an empty one, or one with
    the newlines Qwen3 strips; some with several turns (Qwen3 drops the earlier reasoning)."""
    convs = []
    for n, messages in enumerate(conversations()):
        kinds = (f"Because {n}.", None, "", f"\nStep {n}.\n", f"Think twice {n}.")
        messages = [dict(m) for m in messages]
        for k, m in enumerate(messages):
            if m["role"] == "assistant" and (n + k) % 6:
                m["reasoning_content"] = kinds[(n + k) % len(kinds)]
        convs.append(messages)
    return convs


@pytest.mark.parametrize("train_on", ["assistant", "last_assistant", "all"])
def test_reasoning_slots_give_the_same_layouts_without_rendering(train_on):
    # A reasoning is a slot of the skeleton as a content is, so reasoning conversations share
    # shapes; the layouts (trained reasoning included) are those of the renderings.
    tpl = qwen3_template()
    field = "reasoning_content"
    convs = reasoning_conversations()
    plain = [outcome(tpl, m, train_on, None, field) for m in convs]
    assert not [x for x in plain if isinstance(x, str)]
    assert sum("<think>\nThink twice" in x.text for x in plain) > 3
    skeletons = Skeletons(tpl, field=field)
    for m in convs:
        outcome(tpl, m, train_on, skeletons, field)
    tpl.renders = 0
    assert [outcome(tpl, m, train_on, skeletons, field) for m in convs] == plain
    # Only the reasoning Qwen3 strips of its newlines answers otherwise than its marker.
    stripped = sum(any((m.get(field) or "").startswith("\n") for m in c) for c in convs)
    assert 0 < tpl.renders <= 2 * stripped
    # Shapes are shared whatever the reasoning says (each text would be a shape otherwise).
    assert len({shape_of(m, field) for m in convs}) < len({shape_of(m) for m in convs})
    a, b = ([{"role": "assistant", "content": "x", field: text}] for text in ("A.", "B."))
    assert shape_of(a, field) == shape_of(b, field) and shape_of(a) != shape_of(b)
    assert shape_of(a, field) != shape_of([{"role": "assistant", "content": "x", field: ""}])


def test_a_skeleton_learns_where_the_generation_prompt_ends():
    tpl = qwen3_template()
    field = "reasoning_content"
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", field: "Add."},
    ]
    skeletons = Skeletons(tpl, field=field)
    skeletons.get(messages)
    skeleton = skeletons.get(messages)  # met twice: traced, so it fills without rendering
    assert skeleton is not None and skeleton.slots == (1,)
    assert skeleton.order == (0, 3, 1)  # the reasoning (slot n + 1) before its content
    assert skeleton.opening(1) == len("<think>\n")  # the prompt ends before the think tag
    full, ranges = skeleton.fill(messages)
    assert full[ranges[3][0] - skeleton.opening(1) :].startswith("<think>\nAdd.")
    assert full[: ranges[3][0] - skeleton.opening(1)].endswith("<|im_start|>assistant\n")


def test_the_order_of_a_mappings_keys_is_part_of_the_shape():
    # Qwen3 writes a tool call's arguments with tojson, in their order: two orders are two
    # renderings, so a skeleton of one order must never write the other (it did, when shapes
    # were keyed on sorted keys and the shape had been traced).
    tpl = qwen3_template()

    def call(arguments: dict[str, Any], question: str) -> list[dict[str, Any]]:
        function = {"name": "f", "arguments": arguments}
        return [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [{"function": function}]},
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "done"},
        ]

    skeletons = Skeletons(tpl)
    for question in ("x", "y"):  # met twice: traced, then filled without rendering
        layout_chat(tpl, call({"a": 1, "b": 2}, question), "assistant", skeletons)
    swapped = call({"b": 2, "a": 1}, "z")
    got = layout_chat(tpl, swapped, "assistant", skeletons)
    assert got == layout_chat(tpl, swapped, "assistant", None)
    assert '{"b": 2, "a": 1}' in got.text


def test_skeletons_without_the_reasoning_field_leave_reasoning_turns_to_the_renderings():
    # Skeletons keyed without a reasoning field (the reasoning is part of the shape, not a
    # slot) cannot say where a trained reasoning starts: those conversations take the
    # renderings; conversations without a reasoning still use the skeleton.
    tpl = qwen3_template()
    field = "reasoning_content"
    question = {"role": "user", "content": "2+2?"}
    reasoned = [question, {"role": "assistant", "content": "4", field: "Add."}]
    plain = [question, {"role": "assistant", "content": "4"}]
    skeletons = Skeletons(tpl)  # no field
    for messages in (reasoned, plain, reasoned, plain):
        assert layout_chat(tpl, messages, "assistant", skeletons, field) == layout_chat(
            tpl, messages, "assistant", None, field
        )
    tpl.renders = 0
    got = layout_chat(tpl, reasoned, "assistant", skeletons, field)
    assert tpl.renders > 0 and got.text[got.trained[0][0] :].startswith("<think>\nAdd.")
    tpl.renders = 0
    layout_chat(tpl, plain, "assistant", skeletons, field)
    assert tpl.renders == 0


@pytest.mark.parametrize("name", ["qwen2_5", "llama3_2"])
@pytest.mark.parametrize("train_on", ["assistant", "all"])
def test_tool_call_turns_whose_empty_content_is_left_out_use_skeletons(name, train_on):
    # Qwen2.5's and Llama 3.2's templates write nothing for an empty content beside calls: the
    # skeleton leaves that content's slot out and finds the turn from the generation prompt,
    # with the same layout as the renderings and, once shapes are known, without rendering.
    path = QWEN3.parent / name / "tokenizer.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make tokenizers` (`make test` does)")
    tpl = Counting(find_template(str(path), None), date=DAY)
    convs = []
    for c in generate_conversations(60, seed=9, mean_words=12, tool_calls=True):
        for m in c["messages"]:
            if m.get("tool_calls"):
                m["content"] = ""  # Llama 3.2 leaves out any content beside calls
        convs.append(c["messages"])
    assert sum(m["content"] == "" for c in convs for m in c if m.get("tool_calls")) > 20
    plain = [outcome(tpl, m, train_on, None) for m in convs]
    assert not [x for x in plain if isinstance(x, str)]
    skeletons = Skeletons(tpl)
    for _ in range(2):  # the first meeting of each shape renders its skeleton, the second traces
        for m in convs:
            outcome(tpl, m, train_on, skeletons)
    tpl.renders = 0
    assert [outcome(tpl, m, train_on, skeletons) for m in convs] == plain
    # Llama 3.2 writes a tool turn's content with tojson, which a trace does not follow: its
    # conversations with tool turns are rendered, then placed on their skeletons.
    assert tpl.renders == 0 if name == "qwen2_5" else tpl.renders < len(convs)
