"""Which part of a record ``render_chat`` reads when a record could be read two ways."""

from __future__ import annotations

import pytest

from tests.support.chat_helpers import chat_tokenizer
from tests.support.chat_helpers import render_rows as render
from zephon_server.engine.ops.render_chat import RenderChat

MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return chat_tokenizer(tmp_path_factory.mktemp("tok") / "chatml")


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "are not read" in r.getMessage()]


def test_messages_beside_a_prompt_and_completion_are_rendered_and_said_once(tokenizer, caplog):
    op = RenderChat(tokenizer=tokenizer)
    both = {"messages": MESSAGES, "prompt": "Q:", "completion": " A"}
    with caplog.at_level("WARNING"):
        out = render(op, [both, both, {"messages": MESSAGES}])
    (plain,) = render(RenderChat(tokenizer=tokenizer), [{"messages": MESSAGES}])
    assert out[0].payload["input_ids"].tolist() == plain.payload["input_ids"].tolist()
    said = warnings(caplog)
    assert len(said) == 1
    assert "'messages' and also 'prompt' and 'completion'" in said[0]
    assert "messages_field" in said[0]  # the fix


def test_a_lone_prompt_beside_messages_is_not_warned_about(tokenizer, caplog):
    # UltraChat keeps its first user turn as "prompt" beside "messages": nothing is lost.
    op = RenderChat(tokenizer=tokenizer)
    with caplog.at_level("WARNING"):
        render(op, [{"messages": MESSAGES, "prompt": "Hi", "prompt_id": "x"}])
    assert warnings(caplog) == []
