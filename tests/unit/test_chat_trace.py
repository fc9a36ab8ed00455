"""Traced renderings: a conversation is laid out without rendering only when that is exact.

:mod:`zephon_server.engine.chat_trace` records the questions a template asks of a shape's
contents; a conversation whose contents answer them as the markers did is written from the
skeleton instead of rendered. These tests pin that this never changes a layout, on templates
that ask questions (and contents that answer them differently), and that a template doing
anything else with a content is not traced at all.
"""

from __future__ import annotations

import datetime
import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import CHATML, Counting
from zephon_server.engine.chat_layout import ChatError, end_of_turn, layout_chat
from zephon_server.engine.chat_skeleton import Skeletons
from zephon_server.engine.chat_template import ChatTemplate, TemplateSource, find_template
from zephon_server.engine.chat_trace import MARKER, Tracer, holds, marker

DAY = datetime.date(2025, 1, 1)
QWEN3 = Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3" / "tokenizer.json"
LOOP = "{% for m in messages %}<{{ m.role }}>BODY</{{ m.role }}>\n{% endfor %}"

#: Templates that ask questions of the contents (traced: each has checks).
ASKING = {
    "equals": "{% if m.content == '' %}(empty){% endif %}{{ m.content }}",
    "contains": "{% if 'secret' in m.content %}[hidden]{% endif %}{{ m.content }}",
    "truth": "{% if m.content %}{{ m.content }}{% else %}(none){% endif %}",
    "startswith": "{% if m.content.startswith('!') %}[loud]{% endif %}{{ m.content }}",
    "test": "{% if m.content is string and m.content is not none %}{{ m.content }}{% endif %}",
    "strip": "{{ m.content.strip() }}",
    "lstrip": "{{ m.content.lstrip('\\n') }}",
    "trim": "{{ m.content | trim }}",
    "joined": "{{ '[' + m.content + ']' }}",
    "in-list": "{% if m.content in ['a', 'b'] %}(ab){% endif %}{{ m.content }}",
    "trim-equals": "{% if m.content | trim == '' %}(blank){% endif %}{{ m.content }}",
    "conditional": "{{ m.content if m.content else '(empty)' }}",
    "cycle": "{{ loop.cycle(m.content, m.content) }}",
    "selectattr": "{% for x in messages | selectattr('content', 'equalto', 'a') %}(a)"
    "{% endfor %}{{ m.content }}",
}
#: Templates that carry contents along and write them at the end (traced, no questions).
CARRYING = (
    "{% set ns = namespace(text='') %}{% for m in messages %}"
    "{% set ns.text = ns.text + '<' + m.role + '>' + m.content + '\n' %}{% endfor %}"
    "{{ ns.text }}"
)
#: Templates that use a content in a way a trace cannot follow (never traced).
OPAQUE = {
    "tilde": "{{ m.content ~ '' }}",
    "upper": "{{ m.content | upper }}",
    "length": "{% if m.content | length > 3 %}(long){% endif %}{{ m.content }}",
    "index": "{{ m.content[0] }}{{ m.content }}",
    "split": "{{ m.content.split('x')[0] }}",
    "method": "{{ m.content.upper() }}",
    "filter-block": "{% filter upper %}{{ m.content }}{% endfilter %}",
    "set-block": "{% set c %}{{ m.content }}{% endset %}{{ c | replace('e', 'E') }}",
    "set-block-joined": "{% set c %}{{ m.content }}{% endset %}{{ c + '' }}",
    "macro": "{% macro w(x) %}{{ x | replace('e', 'E') }}{% endmacro %}{{ w(m.content) }}",
    "tojson": "{{ m.content | tojson }}",
    "message-tojson": "{{ m | tojson }}",
    "iterate": "{% for ch in m.content %}{{ ch }}{% endfor %}",
    "format": "{{ '%s' | format(m.content) }}",
    "percent": "{{ '%.2s' % m.content }}",
    "repeat": "{{ m.content * 2 }}",
    "joined-filter": "{{ ('[' + m.content) | trim }}",
    "compare-contents": "{% if m.content == messages[0].content %}(same){% endif %}{{ m.content }}",
    "strip-marker": "{{ m.content.strip('\\ue000') }}",
    "filter-block-trim": "{% filter trim %}{{ m.content }}{% endfilter %}",
    "str-format": "{{ '{}'.format(m.content) }}",
    "escape": "{{ m.content | e }}",
    "map-join": "{{ messages | map(attribute='content') | join(' ') }}{{ m.content }}",
}
#: Contents that answer the questions above differently from a marker.
CONTENTS = [
    "plain words",
    "",
    "  padded  ",
    "\nleading newline",
    "trailing\n",
    "a",
    "!loud",
    "the secret is out",
    "has </think> inside",
    "ünïcödé ✓ 是",
    "eee",
]


def template(body: str) -> ChatTemplate:
    return ChatTemplate(TemplateSource(LOOP.replace("BODY", body), "test"), date=DAY)


def conversations() -> list[list[dict[str, Any]]]:
    pairs = itertools.product(CONTENTS, CONTENTS[:6])
    convs = [
        [{"role": "user", "content": u}, {"role": "assistant", "content": a}] for u, a in pairs
    ]
    convs += [
        [
            {"role": "system", "content": s},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": a},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": b},
        ]
        for s, a, b in zip(CONTENTS, reversed(CONTENTS), CONTENTS[3:] + CONTENTS[:3])
    ]
    return convs


def any_empty(messages: list[dict[str, Any]]) -> bool:
    return any(m["content"] == "" for m in messages)


def outcome(tpl: ChatTemplate, messages: list[dict[str, Any]], sk: Skeletons | None) -> Any:
    try:
        return layout_chat(tpl, messages, "all", sk)
    except ChatError as exc:
        return f"ChatError: {exc}"


@pytest.mark.parametrize("name", sorted(ASKING))
def test_a_template_asking_questions_is_traced_and_laid_out_exactly(name):
    tpl = Counting(TemplateSource(LOOP.replace("BODY", ASKING[name]), "test"), date=DAY)
    convs = conversations()
    plain = [outcome(tpl, m, None) for m in convs]
    skeletons = Skeletons(tpl)
    for m in convs:
        skeletons.get(m)
    sks = [skeletons.get(m) for m in convs]
    # Every shape is traced, but one with an empty content its template does not write (an
    # empty content's marker answers as the empty string): that one has no skeleton.
    assert all(sk is not None for m, sk in zip(convs, sks) if not any_empty(m))
    assert all(sk is None or sk.checks is not None for sk in sks)
    assert [outcome(tpl, m, skeletons) for m in convs] == plain  # shapes and closes learned
    same = [m for m, sk in zip(convs, sks) if sk and holds(sk.checks, [x["content"] for x in m])]
    tpl.renders = 0
    assert [outcome(tpl, m, skeletons) for m in convs] == plain
    assert same and tpl.renders >= len(convs) - len(same)  # each differing one is rendered
    tpl.renders = 0
    for m in same:
        outcome(tpl, m, skeletons)
    assert tpl.renders == 0  # the others are written from the skeleton
    # These ask nothing a content answers otherwise (empty contents have shapes of their own).
    if name not in ("joined", "test", "cycle", "equals"):
        assert len(same) < len(convs)


@pytest.mark.parametrize("name", sorted(OPAQUE))
def test_a_template_doing_anything_else_with_a_content_is_not_traced(name):
    tpl = template(OPAQUE[name])
    convs = conversations()
    skeletons = Skeletons(tpl)
    for m in convs:
        sk = skeletons.get(m)
        # (a strip of an empty content leaves it empty, whatever it strips: no content is
        # written otherwise when every content is empty)
        assert sk is None or sk.checks is None or not any(x["content"] for x in m)
    assert [outcome(tpl, m, skeletons) for m in convs] == [outcome(tpl, m, None) for m in convs]


def test_an_empty_content_has_a_shape_of_its_own_written_without_rendering():
    # A template that writes a turn differently after an empty content (Qwen3's newline
    # before a tool call): the empty content's marker answers as the empty string, so the
    # turn is attributed, and its shape's conversations are written from the skeleton.
    body = "{{ m.content }}{% if m.content %}\n{% endif %}<end>"
    tpl = Counting(TemplateSource(LOOP.replace("BODY", body), "test"), date=DAY)
    convs = [
        [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        for u in ("q", "r", "s")
        for a in ("", "ok")
    ]
    plain = [outcome(tpl, m, None) for m in convs]
    assert not any(isinstance(o, str) for o in plain)  # no ChatError: every one attributed
    skeletons = Skeletons(tpl)
    for m in convs:
        outcome(tpl, m, skeletons)  # the shapes, and their closes, learned
    tpl.renders = 0
    assert [outcome(tpl, m, skeletons) for m in convs] == plain
    assert tpl.renders == 0


def test_checks_record_each_question_once_with_the_markers_answer():
    tpl = template(ASKING["startswith"] + ASKING["contains"] + ASKING["lstrip"])
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    probe = tpl.render([{**m, "content": marker(i)} for i, m in enumerate(messages)])
    traced = Tracer(tpl).checks(messages, probe)
    assert traced is not None and traced.escaped == frozenset()
    checks = traced.checks
    assert [(i, args, answer) for i, _, args, answer in checks] == [
        (0, ("!",), False),
        (0, ("secret",), False),
        (0, ("\n",), True),
        (1, ("!",), False),
        (1, ("secret",), False),
        (1, ("\n",), True),
    ]
    assert holds(checks, ["x", "y"]) and not holds(checks, ["x", "!y"])
    assert not holds(checks, ["\nx", "y"])
    # A probe the traced rendering does not write (another template's) gives no checks.
    assert Tracer(tpl).checks(messages, probe + "!") is None


def test_the_real_qwen3_template_is_traced_and_its_reasoning_turns_are_rendered():
    if not QWEN3.exists():
        pytest.fail(f"{QWEN3} is missing: run `make tokenizers` (`make test` does)")
    tpl = Counting(find_template(str(QWEN3), None), date=DAY)
    convs = conversations()
    plain = [outcome(tpl, m, None) for m in convs]
    skeletons = Skeletons(tpl)
    for m in convs:
        assert skeletons.get(m) is not None and skeletons.get(m).checks is not None
    tpl.renders = 0
    assert [outcome(tpl, m, skeletons) for m in convs] == plain
    thinking = [m for m in convs if any("</think>" in x["content"] for x in m[1:])]
    assert thinking and tpl.renders >= len(thinking)  # '</think>' in content: rendered
    assert tpl.renders < len(convs) // 2


def test_a_content_with_the_marker_is_refused_on_both_paths():
    tpl = template("{{ m.content }}")
    skeletons = Skeletons(tpl)
    bad = [{"role": "user", "content": f"x{MARKER}"}, {"role": "assistant", "content": "y"}]
    skeletons.get([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    assert outcome(tpl, bad, skeletons) == outcome(tpl, bad, None)
    assert "private content marker" in outcome(tpl, bad, skeletons)


def test_chatml_conversations_are_filled_from_the_skeleton():
    tpl = Counting(TemplateSource(CHATML, "test"), date=DAY)
    skeletons = Skeletons(tpl)
    convs = conversations()
    for m in convs:  # each shape's skeleton, and how its turns close, learned once
        layout_chat(tpl, m, "assistant", skeletons)
    tpl.renders = 0
    layouts = [layout_chat(tpl, m, "assistant", skeletons) for m in convs]
    assert tpl.renders == 0
    assert layouts == [layout_chat(tpl, m, "assistant", None) for m in convs]


def test_contents_carried_in_a_namespace_are_traced_and_written_exactly():
    tpl = Counting(TemplateSource(CARRYING, "test"), date=DAY)
    convs = conversations()
    plain = [outcome(tpl, m, None) for m in convs]
    skeletons = Skeletons(tpl)
    assert all(met_twice(skeletons, m).checks == () for m in convs)  # nothing asked
    assert [outcome(tpl, m, skeletons) for m in convs] == plain  # closes learned
    tpl.renders = 0
    assert [outcome(tpl, m, skeletons) for m in convs] == plain
    assert tpl.renders == 0


def test_a_shape_asking_too_many_questions_is_rendered_instead():
    """Distinct questions are bounded per shape (a base plus a share per message), so a
    skeleton's checks stay small and cheap to check; past the bound the shape renders."""
    from zephon_server.engine.chat_trace import MAX_CHECKS_BASE, MAX_CHECKS_PER_MESSAGE

    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    bound = MAX_CHECKS_BASE + MAX_CHECKS_PER_MESSAGE * len(messages)

    def asking(n: int) -> ChatTemplate:
        body = (
            f"{{% for w in range({n}) %}}{{% if m.content == 'w' ~ w %}}!{{% endif %}}"
            "{% endfor %}{{ m.content }}"
        )
        return template(body)

    few, many = asking(bound // 2 - 1), asking(bound // 2 + 1)
    assert len(met_twice(Skeletons(few), messages).checks) == 2 * (bound // 2 - 1)
    refused = met_twice(Skeletons(many), messages)
    assert refused.traced and refused.checks is None
    convs = conversations()
    skeletons = Skeletons(many)
    assert [outcome(many, m, skeletons) for m in convs] == [outcome(many, m, None) for m in convs]


def met_twice(skeletons: Skeletons, messages: list[dict[str, Any]]) -> Any:
    """The skeleton of ``messages``' shape once it is traced: a shape is traced when it is met
    a second time."""
    skeletons.get(messages)
    return skeletons.get(messages)


def test_a_shape_is_traced_when_it_is_met_a_second_time():
    # Records with their own tool calls or fields are shapes of their own: tracing each would
    # cost more than rendering it. The first one of a shape is rendered; from the second on,
    # conversations are written from the skeleton.
    tpl = Counting(TemplateSource(CHATML, "test"), date=DAY)
    first = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    second = [{"role": "user", "content": "r"}, {"role": "assistant", "content": "b"}]
    skeletons = Skeletons(tpl)
    skeleton = skeletons.get(first)
    assert not skeleton.traced and skeleton.checks is None  # met once: not traced
    assert skeleton.fill(first) is None  # so its conversations are rendered
    skeleton.close(0)  # what closes the first turn, learned once per shape
    assert end_of_turn(tpl) == "<|im_end|>"  # what closes a turn, learned once per template
    tpl.renders = 0
    laid_out = outcome(tpl, second, skeletons)
    assert skeleton.traced and skeleton.checks == ()  # met again: traced
    assert tpl.renders == 0  # and written from the skeleton
    assert laid_out == outcome(tpl, second, None)
