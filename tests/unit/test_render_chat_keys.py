"""``render_chat`` and messages in other conventions: ``role_key``, ``content_key`` and
``role_names`` (ShareGPT's ``{"from": "human", "value": ...}``) render and train exactly as
the same OpenAI-format messages; a message without a configured key is a data error naming the
key and the option, and bad key options are config errors.
"""

from __future__ import annotations

import pytest

from tests.support.chat_helpers import decode
from tests.unit.test_render_chat import render, tok_dirs  # noqa: F401
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.errors import ConfigError, DataError
from zephon_server.engine.ops.render_chat import RenderChat

pytestmark = pytest.mark.timeout(120)


SHAREGPT = {"role_key": "from", "content_key": "value"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


def test_sharegpt_messages_render_and_train_as_the_same_openai_messages(tok_dirs):  # noqa: F811
    convs = generate_conversations(30, seed=13)
    sharegpt = [
        {
            "conversations": [
                {
                    "from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                    "value": m["content"],
                }
                for m in c["messages"]
            ]
        }
        for c in convs
    ]
    plain = RenderChat(tokenizer=tok_dirs["chatml"])
    op = RenderChat(
        tokenizer=tok_dirs["chatml"],
        messages_field="conversations",
        role_names=SHAREGPT_ROLES,
        **SHAREGPT,
    )
    for want, got in zip(render(plain, convs), render(op, sharegpt)):
        assert got.payload["input_ids"].tolist() == want.payload["input_ids"].tolist()
        assert got.payload["loss_mask"].tolist() == want.payload["loss_mask"].tolist()
    assert op.params()["role_names"] == SHAREGPT_ROLES != plain.params()["role_names"]


def test_renamed_messages_keep_their_other_keys_and_name_a_missing_role_key(
    tmp_path,
    tok_dirs,  # noqa: F811
):
    template = tmp_path / "named.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m.role }}|{{ m.name }}]{{ m.content }}<|im_end|>{% endfor %}"
    )
    op = RenderChat(tokenizer=tok_dirs["chatml"], template=str(template), **SHAREGPT)
    first = {"from": "user", "value": "Hi", "name": "ann", "role": "ignored"}
    (out,) = render(op, [{"messages": [first, {"from": "assistant", "value": "Yo"}]}])
    assert decode(op, out.payload["input_ids"]) == "[user|ann]Hi<|im_end|>[assistant|]Yo<|im_end|>"
    with pytest.raises(DataError, match=r"messages\[1\] has no 'from' key \(render_chat.role_key"):
        render(op, [{"messages": [{"from": "user", "value": "Hi"}, {"value": "Yo"}]}])
    with pytest.raises(DataError, match=r"has no 'value' key \(render_chat.content_key"):
        render(op, [{"messages": [{"from": "user", "content": "Hi"}]}])


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"role_key": "x", "content_key": "x"}, "role_key and content_key must differ"),
        ({"content_key": ""}, "content_key must be a non-empty string"),
        ({"role_names": ["human"]}, "role_names must map"),
        ({"role_names": {"human": 1}}, "role_names must map"),
    ],
)
def test_message_key_options_are_checked(tok_dirs, options, error):  # noqa: F811
    with pytest.raises(ConfigError, match=error):
        RenderChat(tokenizer=tok_dirs["chatml"], **options)
