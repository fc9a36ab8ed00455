"""``render_chat`` against the reference: Hugging Face ``transformers``' ``apply_chat_template``.

``render_chat`` promises the tokens a trainer gets from ``apply_chat_template(messages,
tokenize=True)``, but renders each conversation from a traced skeleton of its template, with
its own sandboxed Jinja environment. Here both run on the same records, and the ids must be
equal, record for record: Qwen3's real tokenizer and template (plain, with system prompts,
reasoning, tool calls and tool definitions) and three template layouts on a tokenizer trained
on the spot, plus records chosen to be awkward (non-ASCII and non-NFC text, empty and
whitespace-only turns, a special token's text inside a message), named templates
(``tool_use``) and ``tojson``. The loss masks too, where Hugging Face computes them: a
template whose ``{% generation %}`` blocks hold what an assistant turn trains gives
``assistant_masks`` equal to ``loss_mask``. (Tool-calling records under Qwen2.5's and
Llama 3.2's templates in bulk: tests/service/test_render_chat_reference.py, over a second
of CPU.) ``transformers`` is a test dependency only
(pyproject's ``dev`` extra), pinned so that the reference does not move under the suite.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from tests.support.chat_helpers import chat_tokenizer, trained_runs
from tests.support.chat_helpers import render_rows as render
from tests.support.chat_reference import (
    LLAMA_DATE,
    QWEN3,
    TOOLS,
    assert_same_ids,
    hf_ids,
    hf_messages,
    real,
    reference,
)
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.errors import DataError
from zephon_server.engine.ops.render_chat import RenderChat

pytestmark = pytest.mark.timeout(300)

HEADER = "<|im_start|>assistant\n"
AWKWARD = [
    "Grüße aus Köln, 日本語のテキスト, emoji 🌍🚀 and a ligature ﬁ",
    "e\u0301 and A\u030a: combining marks that NFC composes",
    "",
    "   \n\n  \t",
    "a literal <|im_end|> and <|im_start|>user inside a message",
    "line one\n\n\nline four\r\nand a carriage return",
    " leading and trailing spaces ",
]


def awkward_records(system: bool = True) -> list[dict[str, Any]]:
    """One exchange per awkward text, as the question and as the answer (the answer of an
    empty text is followed by a worded one, so something is trained)."""
    out = []
    for text in AWKWARD:
        messages = [{"role": "system", "content": "Be brief."}] if system else []
        messages += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "And again?"},
            {"role": "assistant", "content": text},
            {"role": "user", "content": "Thanks."},
            {"role": "assistant", "content": "You are welcome."},
        ]
        out.append({"messages": messages})
    return out


@pytest.fixture(scope="module")
def qwen3() -> tuple[RenderChat, Any]:
    if not (QWEN3 / "tokenizer.json").exists():
        pytest.fail(f"{QWEN3} is missing: run `bash tools/fetch-tokenizers.sh build/tokenizers`")
    return RenderChat(tokenizer=str(QWEN3 / "tokenizer.json")), reference(QWEN3)


@pytest.mark.parametrize(
    "options",
    [{}, {"reasoning_words": 30}, {"tool_calls": True}],
    ids=["plain", "reasoning", "tool-calls"],
)
def test_qwen3_ids_equal_apply_chat_template(qwen3, options):
    op, tok = qwen3
    records = generate_conversations(240, seed=17, mean_words=30, **options)
    if options.get("tool_calls"):
        for record in records[::2]:
            record["tools"] = TOOLS
    assert_same_ids(op, tok, records)


def test_qwen3_awkward_records_equal_apply_chat_template(qwen3):
    op, tok = qwen3
    assert_same_ids(op, tok, awkward_records())


@pytest.mark.parametrize("fmt", ["chatml", "headers", "inst"])
def test_template_layouts_on_a_trained_tokenizer_equal_apply_chat_template(tmp_path, fmt):
    # The Mistral layout raises unless roles alternate user/assistant: no system prompts.
    path = chat_tokenizer(tmp_path / fmt, fmt, **({"bos_token": "<s>"} if fmt == "inst" else {}))
    records = generate_conversations(200, seed=23, mean_words=25) + awkward_records(
        system=fmt != "inst"
    )
    if fmt == "inst":
        for record in records:
            record["messages"] = [m for m in record["messages"] if m["role"] != "system"]
    assert_same_ids(RenderChat(tokenizer=path), reference(tmp_path / fmt), records)


#: ChatML with Hugging Face's ``{% generation %}`` blocks around what an assistant turn trains
#: (its content and ``<|im_end|>``): ``apply_chat_template(return_assistant_tokens_mask=True)``
#: then computes the mask ``render_chat`` derives from its turn-by-turn rendering.
CHATML_GENERATION = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_loss_masks_equal_the_assistant_masks_of_generation_blocks(tmp_path):
    path = chat_tokenizer(tmp_path, "chatml", chat_template=CHATML_GENERATION)
    tok = reference(tmp_path)
    records = generate_conversations(200, seed=29, mean_words=25) + awkward_records()
    outputs = render(RenderChat(tokenizer=path), [json.dumps(r).encode() for r in records])
    differing = []
    for i, (record, out) in enumerate(zip(records, outputs)):
        ref = tok.apply_chat_template(
            record["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ours = (out.payload["input_ids"].tolist(), out.payload["loss_mask"].tolist())
        if ours != (list(ref["input_ids"]), list(ref["assistant_masks"])):
            differing.append(i)
    assert not differing, f"{len(differing)} of {len(records)} differ, first {differing[:5]}"


def test_named_templates_and_tojson_equal_apply_chat_template(tmp_path):
    # A tokenizer config with named templates: records with tools render by "tool_use" (which
    # writes the definitions with tojson, non-ASCII included), the others by "default".
    tool_use = (
        "{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}"
        "{% endif %}" + CHATML_GENERATION
    )
    named = [
        {"name": "default", "template": CHATML_GENERATION},
        {"name": "tool_use", "template": tool_use},
    ]
    path = chat_tokenizer(tmp_path, "chatml", chat_template=named)
    unusual = copy.deepcopy(TOOLS)
    unusual[0]["function"]["description"] = 'Schlägt "Wörter" nach: <tab>\t und 🌍'
    records = generate_conversations(60, seed=31, mean_words=20)
    for i, record in enumerate(records):
        if i % 3 == 1:
            record["tools"] = TOOLS
        elif i % 3 == 2:
            record["tools"] = unusual
    tok = reference(tmp_path)
    assert_same_ids(RenderChat(tokenizer=path), tok, records)
    shown = [tok.decode(hf_ids(tok, record)) for record in records[:3]]
    assert "Tools: " not in shown[0] and "Tools: [" in shown[1] and "Schlägt" in shown[2]


def call(word: str, content: str | None) -> dict[str, Any]:
    function = {"name": "lookup", "arguments": {"word": word}}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": function}],
    }


@pytest.mark.parametrize("content", ["", None])
def test_a_tool_call_turn_whose_empty_content_is_left_out_trains_its_calls(content):
    # Qwen2.5 writes `<|im_start|>assistant` then, for a content, a newline and the content,
    # then each call: with an empty content there is no content to find the turn by. The turn
    # is what follows the generation prompt: the calls and <|im_end|>, as the model writes it.
    op, tok = real("qwen2_5")
    record = {
        "messages": [
            {"role": "user", "content": "Define 'ephemeral'."},
            call("ephemeral", content),
            {"role": "tool", "content": "lasting a very short time"},
            {"role": "assistant", "content": "It means short-lived."},
        ]
    }
    (out,) = render(op, [record])
    text = tok.apply_chat_template(hf_messages(record), tokenize=False)
    turns = [t[: t.index("<|im_end|>") + len("<|im_end|>")] for t in text.split(HEADER)[1:]]
    assert turns[0].startswith("<tool_call>\n") and turns[1] == "It means short-lived.<|im_end|>"
    assert out.payload["input_ids"].tolist() == hf_ids(tok, record)
    assert trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"]) == turns


@pytest.mark.parametrize("name", ["llama3_2", "qwen3"])
def test_null_fields_are_left_out_as_apply_chat_template_leaves_them_out(name):
    # OpenAI exports write "tool_calls": null on plain turns; Llama 3.2's template tests
    # `'tool_calls' in message`, and failed on the null (every such record a chat_error).
    op, tok = real(name)
    record = {
        "messages": [
            {"role": "user", "content": "Hi", "name": None},
            {"role": "assistant", "content": "Hello!", "tool_calls": None},
        ]
    }
    assert_same_ids(op, tok, [record], **LLAMA_DATE)  # the reference drops the nulls itself


def test_a_worded_content_the_template_leaves_out_is_an_error_naming_the_fix():
    op, _ = real("llama3_2")
    record = {
        "messages": [{"role": "user", "content": "Define 'ephemeral'."}, call("x", "Let me look.")]
    }
    with pytest.raises(DataError, match=r"write only the calls.*give such turns an empty content"):
        render(op, [record])


@pytest.mark.parametrize("reasoning", ["\n\n", "\n"])
def test_a_reasoning_the_template_strips_to_nothing_trains_the_empty_think_block(qwen3, reasoning):
    # Qwen3's template writes `reasoning.strip("\n")` in the think block: a reasoning of
    # newlines only is written as nothing. It was a chat_error ("cannot be attributed").
    op, tok = qwen3
    record = {
        "messages": [
            {"role": "user", "content": "Q?"},
            {"role": "assistant", "content": "A.", "reasoning_content": reasoning},
        ]
    }
    (out,) = render(op, [record])
    assert out.payload["input_ids"].tolist() == hf_ids(tok, record)
    trained = trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"])
    assert trained == ["<think>\n\n</think>\n\nA.<|im_end|>"]


PIECES = [
    "alpha", "Köln", "日本", "🌍", 'quote"', "back\\slash", "new\nline", "tab\t", "{brace}",
    "<tag>", "'", "", "\n\n", "e\u0301", "ﬁ",
]  # fmt: skip


def random_records(n: int, seed: int, reasoning: bool) -> list[dict[str, Any]]:
    """OpenAI-format function-calling records varied as real ones are: system prompt or not,
    one to three calls per turn with mapping or JSON-string arguments, ids or not, a ``name``
    on some tool turns, empty / null / worded contents beside calls, some reasoning, tool
    definitions on most records."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(PIECES) for _ in range(rng.randint(lo, hi)))

    def turn(role: str, content: str | None) -> dict[str, Any]:
        message = {"role": role, "content": content}
        if reasoning and role == "assistant" and rng.random() < 0.3:
            message["reasoning_content"] = text(1, 6)
        return message

    records = []
    for _ in range(n):
        messages = [turn("system", text(1, 6))] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 3)):
            messages.append(turn("user", text(1, 8)))
            if rng.random() < 0.6:
                calls = []
                for _ in range(rng.randint(1, 3)):
                    args: Any = {"q": text(1, 4)}
                    if rng.random() < 0.5:
                        args = json.dumps(args, ensure_ascii=False)
                    function = {"name": rng.choice(["lookup", "calc"]), "arguments": args}
                    calls.append({"type": "function", "function": function})
                    if rng.random() < 0.5:
                        calls[-1]["id"] = f"call_{rng.randint(0, 999)}"
                messages.append(
                    {**turn("assistant", rng.choice(["", None, text(1, 5)])), "tool_calls": calls}
                )
                for c in calls:
                    answer = turn("tool", text(1, 6))
                    if "id" in c:
                        answer["tool_call_id"] = c["id"]
                    if rng.random() < 0.3:
                        answer["name"] = c["function"]["name"]
                    messages.append(answer)
            messages.append(turn("assistant", text(1, 8)))
        record: dict[str, Any] = {"messages": messages}
        if rng.random() < 0.6:
            record["tools"] = TOOLS
        records.append(record)
    return records


@pytest.mark.parametrize("name", ["qwen3", "qwen2_5"])
def test_random_function_calling_records_equal_apply_chat_template(name):
    assert_same_ids(*real(name), random_records(150, seed=41, reasoning=name == "qwen3"))


def test_a_left_out_empty_content_whose_turn_does_not_follow_the_prompt_is_a_chat_error(tmp_path):
    # A template that leaves an empty content out and writes the turn other than after its
    # generation prompt: the turn cannot be found, and the record is an error saying so.
    odd = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.content %}{{ m.content }}{% else %}(empty){% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\nReply: {% endif %}"
    )
    op = RenderChat(tokenizer=chat_tokenizer(tmp_path, "chatml", chat_template=odd))
    record = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again"},
            {"role": "assistant", "content": ""},
        ]
    }
    with pytest.raises(DataError, match="leaves out its empty content and does not write the turn"):
        render(op, [record])


@pytest.mark.parametrize("answer", ["18C", '{"temp": "18C",\n "sky": "dry"}'])
def test_under_train_on_all_llama_trains_a_tool_answer_as_written_and_its_end(answer):
    # Llama 3.2's template writes a tool's answer with tojson: between quotes, and JSON-escaped
    # when it holds quotes or newlines (as tool answers often do). Under train_on: all such a
    # turn trains its answer as written and <|eot_id|>, never the closing quote between them.
    _, tok = real("llama3_2")
    op = RenderChat(tokenizer=str(QWEN3.parent / "llama3_2" / "tokenizer.json"), train_on="all")
    record = {
        "messages": [
            {"role": "user", "content": "Weather?"},
            call("weather", ""),
            {"role": "tool", "content": answer},
            {"role": "assistant", "content": "It is 18C."},
        ]
    }
    first, again, third = render(op, [record] * 3)  # rendered, then from the shape's skeleton
    for out in (again, third):
        for key in ("input_ids", "loss_mask"):
            assert out.payload[key].tolist() == first.payload[key].tolist()
    assert first.payload["input_ids"].tolist() == hf_ids(tok, record, **LLAMA_DATE)
    runs = trained_runs(op, first.payload["input_ids"], first.payload["loss_mask"])
    written = json.dumps(answer)[1:-1]
    assert runs[0] == "Weather?<|eot_id|>" and runs[-1] == "It is 18C.<|eot_id|>"
    if answer == written:  # the quote after it is a token of its own, untrained
        assert runs[2:-1] == [answer, "<|eot_id|>"]
    else:  # Llama's tokens join the quotes to the JSON's braces: those tokens are the answer's
        assert runs[2:-1] == ['"' + written + '"<|eot_id|>']


@pytest.mark.parametrize("name", ["llama3_2", "qwen3"])
def test_a_prompt_completion_record_starts_as_the_tokenizer_starts_a_text(name):
    # Hugging Face's tokenizer(prompt + completion), which trainers of prompt/completion data
    # use, starts with what the post-processor writes: Llama 3's <|begin_of_text|>, nothing for
    # Qwen. That prefix is never trained.
    _, tok = real(name)
    op = RenderChat(tokenizer=str(QWEN3.parent / name / "tokenizer.json"), completion_eos=False)
    prompt, completion = "Q: what is 2+2? A:", " four."
    (out,) = render(op, [{"prompt": prompt, "completion": completion}])
    ids, mask = out.payload["input_ids"].tolist(), out.payload["loss_mask"].tolist()
    assert ids == tok(prompt + completion)["input_ids"]
    assert trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"]) == [" four."]
    assert mask[0] == 0
