"""``render_chat`` and contents that would be lost or refused without a clear word.

Templates write only the roles they know (Qwen3's: system, user, assistant, tool): a message of
any other role (ShareGPT's ``human`` when ``role_names`` is not set, a ``narrator``) is left out
of the rendering without a word, as ``apply_chat_template`` leaves it out. An untrained message
whose content is missing that way is a ``chat_error`` naming the message, its role and the fix;
a content the template writes rewritten (escaped by ``tojson``), or an empty one, is not.
Tool calls and tool definitions a template without tool support leaves out are named the same
way: a trained turn would teach the model to answer without its calls. A content holding a
lone surrogate (valid JSON, not Unicode) is named as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import chat_tokenizer, decode, trained_runs
from tests.support.chat_helpers import render_rows as render
from tests.unit.test_render_chat_qwen3 import qwen3  # noqa: F401
from zephon_server.engine.chat_layout import ChatError, layout_chat
from zephon_server.engine.errors import DataError
from zephon_server.engine.ops.render_chat import RenderChat

pytestmark = pytest.mark.timeout(120)

#: Writes user and assistant turns only; the system prompt and a tool result as JSON strings.
KNOWN_ROLES = (
    "{% for m in messages %}"
    "{% if m.role in ['user', 'assistant'] %}<{{ m.role }}>{{ m.content }}</s>"
    "{% elif m.role == 'tool' %}<tool>{{ m.content | tojson }}</s>"
    "{% elif m.role == 'system' and loop.first %}<sys>{{ m.content | trim }}</s>"
    "{% endif %}{% endfor %}"
)


def conversation(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


def byte_op(tmp_path: Path, text: str) -> RenderChat:
    """``render_chat`` with the byte tokenizer and ``text`` as its template file."""
    path = tmp_path / "template.jinja"
    path.write_text(text)
    return RenderChat(tokenizer="byte", template=str(path))


@pytest.fixture
def template(tmp_path: Path) -> str:
    path = tmp_path / "known_roles.jinja"
    path.write_text(KNOWN_ROLES)
    return str(path)


@pytest.fixture
def op(template: str) -> RenderChat:
    return RenderChat(tokenizer="byte", template=template)


def test_an_untrained_message_the_template_leaves_out_is_a_chat_error(op):
    conv = conversation(("narrator", "It rains."), ("user", "q"), ("assistant", "a"))
    with pytest.raises(DataError) as caught:
        render(op, [conv])
    message = str(caught.value)
    assert "message 0 (narrator): the chat template writes nothing of its content" in message
    assert "render_chat.role_names" in message


def test_a_late_system_message_the_template_does_not_write_is_named(op):
    conv = conversation(("user", "q"), ("system", "Be brief."), ("assistant", "a"))
    with pytest.raises(DataError, match=r"message 1 \(system\): the chat template writes nothing"):
        render(op, [conv])


def test_contents_written_rewritten_trimmed_or_empty_render(op):
    # A tool result escaped by tojson (quotes, newline) is written, only not verbatim; a system
    # prompt is trimmed; an unknown role with an empty content loses nothing.
    conv = conversation(
        ("system", "  Be brief.\n"),
        ("user", "q"),
        ("assistant", "calling"),
        ("tool", 'line "one"\nline two'),
        ("aside", ""),
        ("assistant", "a"),
    )
    (out,) = render(op, [conv])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    text = decode(op, ids)
    assert '<tool>"line \\"one\\"\\nline two"</s>' in text
    assert text.startswith("<sys>Be brief.</s><user>q</s>")
    assert trained_runs(op, ids, mask) == ["calling</s>", "a</s>"]


def test_sharegpt_roles_without_role_names_are_named(template):
    # The from/value keys renamed but not the roles: every message is left out.
    row = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    keyed = RenderChat(
        tokenizer="byte",
        template=template,
        messages_field="conversations",
        role_key="from",
        content_key="value",
    )
    with pytest.raises(DataError, match=r"message 0 \(human\): .* role 'human'"):
        render(keyed, [row])


def test_qwen3_leaves_out_a_role_it_does_not_know_and_it_is_named(qwen3):  # noqa: F811
    op = RenderChat(tokenizer=qwen3)
    conv = conversation(("user", "q"), ("narrator", "It rains."), ("assistant", "a"))
    with pytest.raises(DataError, match=r"message 1 \(narrator\): the chat template writes"):
        render(op, [conv])
    # The same conversation with the role mapped renders, the narrator's text in it.
    mapped = RenderChat(tokenizer=qwen3, role_names={"narrator": "user"})
    (out,) = render(mapped, [conv])
    assert "It rains." in decode(mapped, out.payload["input_ids"])


def test_a_lone_surrogate_is_named_as_such(qwen3):  # noqa: F811
    op = RenderChat(tokenizer=qwen3)
    row = (
        b'{"messages": [{"role": "user", "content": "half a pair: \\ud83d"}, '
        b'{"role": "assistant", "content": "a"}]}'
    )
    with pytest.raises(DataError, match=r"the text holds a lone surrogate \(U\+D83D at "):
        render(op, [row])


CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def calling(content: Any = None) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": content, "tool_calls": [CALL]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    }


def test_tool_calls_a_template_leaves_out_are_a_chat_error(tmp_path):
    # Plain ChatML writes role and content only: the calling turn would be trained as an empty
    # turn. Named on the first conversation of the shape and on later ones (its skeleton).
    op = RenderChat(tokenizer=chat_tokenizer(tmp_path / "chatml", "chatml"))
    for content in (None, None, "Let me look."):
        with pytest.raises(
            DataError, match=r"message 1 \(assistant\): .* nothing of its tool_calls"
        ):
            render(op, [calling(content)])


def test_tool_calls_left_out_are_named_without_a_skeleton_too(tmp_path):
    op = RenderChat(tokenizer=chat_tokenizer(tmp_path / "chatml", "chatml"))
    messages = [dict(m, content=m["content"] or "") for m in calling()["messages"]]
    with pytest.raises(ChatError, match=r"message 1 \(assistant\): .* nothing of its tool_calls"):
        layout_chat(op.chat_template, messages, "assistant", None)


def test_tool_definitions_a_template_never_reads_are_a_chat_error(tmp_path):
    op = RenderChat(tokenizer=chat_tokenizer(tmp_path / "chatml", "chatml"))
    conv = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
    }
    with pytest.raises(DataError, match="never reads 'tools'"):
        render(op, [conv])
    # Without definitions (null, or an empty list: nothing to lose) the record renders.
    for tools in (None, []):
        (out,) = render(op, [{**conv, "tools": tools}])
        assert len(out.payload["input_ids"]) > 0


def test_qwen3_writes_calls_and_definitions(qwen3):  # noqa: F811
    op = RenderChat(tokenizer=qwen3)
    conv = {**calling(), "tools": [{"type": "function", "function": {"name": "get_weather"}}]}
    (out,) = render(op, [conv])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    assert '"city": "Paris"' in "".join(trained_runs(op, ids, mask))


def test_a_conversation_cut_to_max_length_is_logged_once(op, caplog):
    short = conversation(("user", "q"), ("assistant", "a"))
    long = conversation(("user", "q"), ("assistant", "a" * 100))
    (whole,) = render(op, [long])
    cutting = RenderChat(tokenizer="byte", template=op.template_path, max_length=40)
    with caplog.at_level("WARNING", logger="zephon_server.engine.ops.render_chat"):
        render(cutting, [short])
        assert not caplog.records  # nothing cut: nothing said
        outs = render(cutting, [long, long])
    assert [len(o.payload["input_ids"]) for o in outs] == [40, 40]
    (record,) = caplog.records  # once per worker, naming the first
    assert "longer than max_length 40 tokens are cut" in record.getMessage()
    assert f"record (0, 0), {len(whole.payload['input_ids'])} tokens" in record.getMessage()


def test_tool_calls_written_only_escaped_to_ascii_are_written(tmp_path):
    # Every tool text inside tojson(ensure_ascii=True): no marker is written as it is, yet the
    # calls are in the text (the layout renders such conversations each time).
    op = byte_op(
        tmp_path,
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% if m.tool_calls %}{{ m.tool_calls | tojson(ensure_ascii=True) }}{% endif %}"
        "</s>{% endfor %}",
    )
    outs = render(op, [calling(), calling(), calling("Let me look.")])
    for out in outs:
        assert '"name": "get_weather"' in decode(op, out.payload["input_ids"])
    messages = [dict(m, content=m["content"] or "") for m in calling()["messages"]]
    assert "get_weather" in layout_chat(op.chat_template, messages, "assistant", None).text


def test_a_content_written_in_another_case_is_written(tmp_path):
    op = byte_op(
        tmp_path,
        "{% for m in messages %}<{{ m.role }}>"
        "{% if m.role == 'system' %}{{ m.content | upper }}{% else %}{{ m.content }}{% endif %}"
        "</s>{% endfor %}",
    )
    conv = conversation(("system", "Be brief."), ("user", "q"), ("assistant", "a"))
    (out,) = render(op, [conv])
    assert decode(op, out.payload["input_ids"]).startswith("<system>BE BRIEF.</s>")


def test_a_left_out_content_whose_text_is_elsewhere_in_the_rendering_is_named(op):
    # Its text repeated by the answer, or short enough to be template text: still left out.
    for aside, answer in (("It rains.", "It rains. Take a coat."), ("user", "a")):
        conv = conversation(("narrator", aside), ("user", "q"), ("assistant", answer))
        with pytest.raises(DataError, match=r"message 0 \(narrator\): the chat template writes"):
            render(op, [conv])
