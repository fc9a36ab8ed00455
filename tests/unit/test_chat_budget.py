"""The chat-template render budget: hostile templates fail closed, ordinary ones are unchanged.

Each hostile form (nested huge loops, loops whose ``if`` rejects everything, a recursive
loop, a macro calling itself without end or twice per call, a huge output, a huge repetition
or power) must end, quickly (the module's timeout), in a :class:`ChatTemplateError` naming the
budget it went over and saying the template is the problem. An ordinary multi-turn
conversation renders exactly as before, and in a pipeline the records a hostile template
cannot render follow the dataset's ``on_error`` (skipped and counted, or an error naming file
and row).
"""

from __future__ import annotations

import datetime
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chat_helpers import CHATML, HEADERS, INST, rows_and_tombstones
from zephon_server.engine import chat_budget
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.chat_template import ChatTemplate, ChatTemplateError, TemplateSource
from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_jsonl
from zephon_server.engine.errors import DataError

pytestmark = pytest.mark.timeout(30)

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3?"},
    {"role": "assistant", "content": "6."},
]
FIX = "the template is the problem: fix it, or give render_chat: {template: PATH}"
STEPS = "render budget of 15000 loop iterations and macro calls (10000 + 1000 per message"


def template(text: str) -> ChatTemplate:
    return ChatTemplate(TemplateSource(text, "test.jinja"), date=datetime.date(2026, 1, 1))


def fails(text: str, budget: str, messages: list[dict[str, Any]] = CONV) -> str:
    with pytest.raises(ChatTemplateError) as info:
        template(text).render(messages)
    message = str(info.value)
    assert budget in message and FIX in message, message
    return message


@pytest.mark.parametrize(
    "text",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ loop.index }}{% endfor %}"
        "{% endfor %}",
        # iterations an `if` rejects still count (else the inner loops run 10^10 tests)
        "{% for i in range(100000) %}{% for j in range(100000) if false %}{% endfor %}{% endfor %}",
        # a list the budget cannot cover is counted element by element
        "{% set big = range(100000) | list %}{% for i in big %}{% for j in big %}{% endfor %}"
        "{% endfor %}",
        # loops over a filter's generator, inside a loop over the messages
        "{% for m in messages %}{% for c in range(100000) | map('string') %}{% endfor %}"
        "{% endfor %}",
        # loop.length materialises the whole iterable
        "{% for i in range(100000) | select %}{{ loop.length }}{% break %}{% endfor %}"
        "{% for i in range(100000) | select %}{{ loop.length }}{% break %}{% endfor %}",
    ],
    ids=["nested", "nested-with-loop", "rejected-by-if", "big-list", "filter-generator", "length"],
)
def test_huge_loops_go_over_the_step_budget(text):
    fails(text, STEPS)


def test_a_recursive_loop_counts_the_iterables_it_recurses_into():
    text = (
        "{% for i in range(100) recursive %}{% if loop.depth < 6 %}{{ loop(range(100)) }}"
        "{% endif %}{% endfor %}"
    )
    fails(text, STEPS)
    # ... through the `if` of a recursive loop as well
    text = "{% for i in range(100) if i < 0 or true recursive %}{{ loop(range(100)) }}{% endfor %}"
    message = fails(text, "budget")
    assert STEPS in message or "call depth budget" in message


def test_macro_recursion_goes_over_the_call_depth_or_step_budget():
    fails("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "call depth budget")
    # depth 60 is allowed, but 2^60 calls are not
    fails(
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(60) }}",
        STEPS,
    )
    # a call block's caller() is a macro too
    fails(
        "{% macro f() %}{% call f() %}{% endcall %}{{ caller() }}{% endmacro %}"
        "{% call f() %}x{% endcall %}",
        "budget",
    )


def test_python_recursion_limit_is_a_chat_template_error():
    # A recursive loop nests Python frames without a macro: Python's own limit ends it.
    message = fails("{% for i in [1] recursive %}{{ loop([1]) }}{% endfor %}", "call depth")
    assert "recursed deeper than Python allows" in message


def test_huge_output_goes_over_the_output_budget():
    chars = sum(len(m["role"]) + len(m["content"]) for m in CONV)
    message = fails(
        "{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}",
        f"output budget of {(1 << 20) + 16 * chars} characters (1048576 + 16 per character",
    )
    assert "it wrote" in message
    # the budget grows with the conversation: 16 output characters per input character
    long = [{"role": "user", "content": "y" * 100_000}, {"role": "assistant", "content": "z"}]
    text = "{% for m in messages %}{{ m.content * 10 }}{% endfor %}"
    assert len(template(text).render(long)) == 1_000_010
    # past the budget's 1 MiB floor in many pieces, under the full budget: rendered whole
    text = "{% for i in range(300) %}{{ i }}:{{ messages[0].content[:5000] }}{% endfor %}"
    expected = "".join(f"{i}:" + "y" * 5000 for i in range(300))
    assert template(text).render(long) == expected


def test_repetition_and_powers_are_bounded_before_they_are_computed():
    fails("{{ 'x' * 10000000000 }}", "repeats a sequence of 1 10000000000 times")
    fails("{{ messages * 100000000 }}", "output budget")
    fails("{{ 2 ** 100000000 }}", "integer of about")
    # a constant expression is not folded when the template is compiled (that would hang)
    fails("{{ 2 ** 1000000000000 }}", "integer of about")
    fails(
        "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
        "{% endfor %}{{ ns.x }}",
        "integer of about",
    )
    # ordinary arithmetic is untouched
    assert template("{{ 3 * 4 }} {{ 2 ** 10 }} {{ 'ab' * 3 }} {{ 2.5 * 2 }}").render(CONV) == (
        "12 1024 ababab 5.0"
    )


GROW = "{% set ns = namespace(v=START) %}{% for i in range(40) %}{% set ns.v = STEP %}{% endfor %}"


@pytest.mark.parametrize(
    ("start", "step"),
    [
        ("[1]", "ns.v + ns.v"),  # a list doubled 40 times: 2**40 items, no output at all
        ("'ab'", "ns.v + ns.v"),
        ("'ab'", "ns.v ~ ns.v"),
        ("'ab'", "ns.v.replace('a', ns.v)"),
        ("'ab'", "ns.v | replace('a', ns.v)"),
        ("'ab'", "ns.v.join([ns.v, ns.v, 'x'])"),
        ("'ab'", "[ns.v, ns.v] | join(ns.v)"),
    ],
    ids=["list+", "str+", "str~", "str.replace", "|replace", "str.join", "|join"],
)
def test_values_grown_without_output_go_over_the_output_budget(start, step):
    fails(GROW.replace("START", start).replace("STEP", step), "more than its output budget")


@pytest.mark.parametrize(
    "text",
    [
        "{{ 'x'.center(10 ** 12) }}",
        "{{ 'x' | center(10 ** 12) }}",
        "{{ 'x'.ljust(10 ** 12) }}",
        "{{ 'x\\ny' | indent(10 ** 12) }}",
        "{{ '%1000000000000d' % 1 }}",
        "{{ '{:>1000000000000}'.format(1) }}",
        "{{ '\\t'.expandtabs(10 ** 12) }}",
        "{{ ('ab ' * 1000) | wordwrap(2, wrapstring='x' * 100000) }}",
        "{{ ('a\\n' * 1000) | indent('x' * 100000) }}",
        "{{ ''.replace('', 'x' * 100000) * 1 }}{{ ('y' * 1000).replace('', 'x' * 100000) }}",
    ],
)
def test_widths_are_refused_before_the_value_is_made(text):
    fails(text, "more than its output budget")


def test_a_huge_json_indent_is_refused():
    fails("{{ messages | tojson(indent=100000000) }}", "an indent of 100000000")


def test_ordinary_joins_and_pads_are_untouched():
    text = (
        "{{ 'a' ~ 'b' ~ 1 }} {{ 'x' + 'y' }} {{ [1] + [2] }} {{ '%03d' % 7 }} "
        "{{ 'ab'.center(6, '.') }} {{ ['a', 'b'] | join(', ') }} {{ 'a b' | replace(' ', '_') }}"
        " {{ '{:>4}'.format('z') }} {{ messages[0] | tojson(indent=2) | length > 0 }}"
    )
    assert template(text).render(CONV) == "ab1 xy [1, 2] 007 ..ab.. a, b a_b    z True"


def test_a_loop_that_breaks_early_is_not_charged_for_what_it_skipped():
    # 12 loops over 100000 numbers, each leaving at once: far under the budget.
    text = (
        "{% for k in range(12) %}{% for i in range(100000) %}{% break %}{% endfor %}{% endfor %}ok"
    )
    assert template(text).render(CONV) == "ok"


@pytest.mark.parametrize("text", [CHATML, HEADERS, INST], ids=["chatml", "headers", "inst"])
def test_ordinary_templates_render_as_the_plain_sandbox_does(text):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    convs = [c["messages"] for c in generate_conversations(30, seed=4)]
    convs = [c for c in convs if text != INST or c[0]["role"] == "user"]
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    plain = env.from_string(text)
    tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    ours = ChatTemplate(TemplateSource(text, "t", tokens), date=datetime.date(2026, 1, 1))
    for conv in convs:
        expected = plain.render(messages=conv, add_generation_prompt=False, **tokens)
        assert ours.render(conv) == expected
    long = CONV[1:] * 250  # 1000 messages: the linear budgets keep up
    assert ours.render(long) == plain.render(messages=long, add_generation_prompt=False, **tokens)


def test_budget_constants_are_linear_in_the_conversation():
    budget = chat_budget.RenderBudget(CONV)
    assert budget.step_limit == 10_000 + 1_000 * len(CONV)
    chars = sum(len(m["role"]) + len(m["content"]) for m in CONV)
    assert budget.output_limit() == (1 << 20) + 16 * chars


# ------------------------------------------------------------------------- in a pipeline

HOSTILE = (
    "{% for m in messages %}"
    "{% if m['content'] == 'boom' %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n"
    "{% endfor %}"
)
BOOM_ROWS = (3, 7)


def hostile_pipeline(tmp_path: Path, on_error: str) -> tuple[Any, Any, Path]:
    convs: list[Any] = list(generate_conversations(12, seed=2))
    for row in BOOM_ROWS:
        convs[row] = {
            "messages": [{"role": "user", "content": "boom"}, {"role": "assistant", "content": "a"}]
        }
    data = write_jsonl(tmp_path / "chat" / "chat.jsonl", convs)
    hostile = tmp_path / "hostile.jinja"
    hostile.write_text(HOSTILE)
    config = {
        "seed": 1,
        "lanes": 1,
        "chunk_size": 4,
        "end_of_data": "longest",
        "datasets": [{"name": "chat", "path": str(data), "weight": 1.0, "on_error": on_error}],
        "pipeline": [
            {"render_chat": {"tokenizer": "byte", "template": str(hostile)}},
            {"batch": {"microbatch_size": 2, "drop_last": False}},
        ],
    }
    pipe, execution = parse_config(yaml.safe_load(yaml.safe_dump(config)))
    return pipe, execution, data


def test_hostile_template_records_are_skipped_and_counted(tmp_path):
    pipe, execution, _ = hostile_pipeline(tmp_path, "skip")
    run = pipe.run(execution)
    rows, tombstones = rows_and_tombstones(run)
    assert tombstones == Counter({(row, "chat_error"): 1 for row in BOOM_ROWS})
    assert rows == set(range(12)) - set(BOOM_ROWS)
    assert run.stats()["skipped"] == {"chat": len(BOOM_ROWS)}


def test_hostile_template_fails_naming_file_row_and_budget(tmp_path):
    pipe, execution, data = hostile_pipeline(tmp_path, "fail")
    with pytest.raises(DataError) as info:
        for _ in pipe.run(execution):
            pass
    message = str(info.value)
    assert message.startswith(f"dataset 'chat': {data}:line {BOOM_ROWS[0] + 1}: "), message
    assert "render budget of 12000 loop iterations" in message and FIX in message


def test_a_function_named_like_a_growing_method_is_called_as_usual():
    # A callable named join or format that is no str method (a template variable's function,
    # a macro) is called as it is: it has no string to size.
    def join(value: str) -> str:
        return f"[{value}]"

    text = "{% macro format() %}f{% endmacro %}{{ join('x') }}{{ format() }}"
    source = TemplateSource(text, "test.jinja")
    rendered = ChatTemplate(source, date=datetime.date(2026, 1, 1), variables={"join": join})
    assert rendered.render(CONV) == "[x]f"
