"""``render_chat`` and templates that end a conversation with text of its own.

Phi-3's template, and ChatML fine-tunes that append the EOS, write something once after the
last turn when no generation is asked for (``{% else %}{{ eos_token }}``). It is not part of
any turn: the last turn's end of turn stops before it, and an earlier turn's end of turn is
what it has in common with the text that follows it in the conversation, never the next
turn's header (before, the character-level common part of ``<|im_end|>\\n<|endoftext|>`` and
``<|im_end|>\\n<|im_start|>user`` was ``<|im_end|>\\n<|``, which trained the newline and the
next header's ``<|im_start|>``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chat_helpers import CHATML, chat_tokenizer, trained_runs
from tests.support.chat_helpers import render_rows as render
from zephon_server.engine.chat_layout import conversation_end, end_of_turn
from zephon_server.engine.ops.render_chat import RenderChat

pytestmark = pytest.mark.timeout(120)

TURNS = [("user", "2+2?"), ("assistant", "4"), ("user", "3+3?"), ("assistant", "6")]
MESSAGES = {"messages": [{"role": r, "content": c} for r, c in TURNS]}
ENDING = (
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% else %}{{ eos_token }}{% endif %}"
)
#: ChatML whose conversations end with the EOS, after the last turn's newline.
CHATML_EOS = CHATML.split("{% if add_generation_prompt %}")[0] + ENDING
#: The same turns without the newline after the end token (the parting is inside a special
#: token: <|endoftext|> against <|im_start|>).
GLUED = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}"
    "{% endfor %}" + ENDING
)


def op_for(tmp_path: Path, template: str, train_on: str = "assistant") -> RenderChat:
    path = chat_tokenizer(tmp_path, chat_template=template, eos_token="<|endoftext|>")
    return RenderChat(tokenizer=path, train_on=train_on)


@pytest.mark.parametrize("template", [CHATML_EOS, GLUED], ids=["newline", "glued"])
def test_the_conversation_end_is_trained_in_no_turn(tmp_path, template):
    op = op_for(tmp_path, template)
    (rec,) = render(op, [MESSAGES])
    runs = trained_runs(op, rec.payload["input_ids"], rec.payload["loss_mask"])
    assert runs == ["4<|im_end|>", "6<|im_end|>"]
    assert end_of_turn(op.chat_template) == "<|im_end|>"
    assert conversation_end(op.chat_template).strip("\n") == "<|endoftext|>"


def test_under_all_every_turn_keeps_its_own_end_of_turn(tmp_path):
    op = op_for(tmp_path, CHATML_EOS, train_on="all")
    (rec,) = render(op, [MESSAGES])
    runs = trained_runs(op, rec.payload["input_ids"], rec.payload["loss_mask"])
    assert runs == [f"{content}<|im_end|>" for _, content in TURNS]


def test_templates_that_write_nothing_after_the_last_turn_have_no_conversation_end(tmp_path):
    op = op_for(tmp_path, CHATML)
    assert conversation_end(op.chat_template) == ""
    assert end_of_turn(op.chat_template) == "<|im_end|>"
