"""``render_chat`` and contents that would be lost or refused without a clear word.

Templates write only the roles they know (Qwen3's: system, user, assistant, tool): a message of
any other role (ShareGPT's ``human`` when ``role_names`` is not set, a ``narrator``) is left out
of the rendering without a word, as ``apply_chat_template`` leaves it out. An untrained message
whose content is missing that way is a ``chat_error`` naming the message, its role and the fix;
a content the template writes rewritten (escaped by ``tojson``), or an empty one, is not. A
content holding a lone surrogate (valid JSON, not Unicode) is named as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.chat_helpers import decode, trained_runs
from tests.support.chat_helpers import render_rows as render
from tests.unit.test_render_chat_qwen3 import qwen3  # noqa: F401
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
