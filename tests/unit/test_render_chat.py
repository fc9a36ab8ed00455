"""``render_chat``: chat and prompt/completion records to ``input_ids`` and ``loss_mask``.

The mask comes from rendering the conversation turn by turn: decoding every run of trained
tokens gives back exactly each trained message's content followed by its end-of-turn token,
for three template layouts (ChatML, Llama 3 headers, Mistral [INST]) and a real trained BPE
tokenizer as well as the byte tokenizer. Bad records (no assistant turn, nothing masked, a
truncation that cuts every trained token, a malformed messages field, a template error) stop
the pipeline naming file and line, or are skipped and counted under ``on_error: skip``.

The tests of the same topic that need a subprocess, worker processes, a socket or a real
file system limit are in ``tests/service/test_render_chat.py``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.support.chat_helpers import (
    CHATML,
    chat_tokenizer,
    decode,
    rows_and_tombstones,
    trained_runs,
)
from tests.support.chat_helpers import (
    render_rows as render,
)
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_jsonl
from zephon_server.engine.errors import ConfigError, DataError
from zephon_server.engine.ops.render_chat import RenderChat
from zephon_server.engine.records import SampleRecord
from zephon_server.engine.token_masks import token_mask

pytestmark = pytest.mark.timeout(120)

END = {"chatml": "<|im_end|>", "headers": "<|eot_id|>", "inst": "</s>"}
HEADER = {"chatml": "<|im_start|>assistant\n", "headers": "<|start_header_id|>assistant"}


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("chat-tok")
    return {fmt: chat_tokenizer(root / fmt, fmt) for fmt in ("chatml", "headers", "inst")}


# ------------------------------------------------------------------ what is trained, exactly


@pytest.mark.parametrize("fmt", ["chatml", "headers"])
def test_trained_tokens_are_exactly_assistant_contents_and_end_tokens(tok_dirs, fmt):
    op = RenderChat(tokenizer=tok_dirs[fmt])
    convs = generate_conversations(40, seed=3)
    for conv, out in zip(convs, render(op, convs)):
        ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
        assert ids.dtype == np.int32 and mask.dtype == np.uint8 and len(ids) == len(mask)
        expected = [m["content"] + END[fmt] for m in conv["messages"] if m["role"] == "assistant"]
        assert trained_runs(op, ids, mask) == expected
        untrained = decode(op, ids[mask == 0])
        assert untrained.count(HEADER[fmt]) == len(expected)  # headers are never trained
        assert out.meta.spans[0].length == len(ids) and out.meta.closes == (out.meta.doc,)


def test_train_on_last_assistant_and_all(tok_dirs):
    conv = next(
        c
        for c in generate_conversations(20, seed=9)
        if sum(m["role"] == "assistant" for m in c["messages"]) >= 2
    )
    messages = conv["messages"]
    last = RenderChat(tokenizer=tok_dirs["chatml"], train_on="last_assistant")
    (out,) = render(last, [conv])
    assert trained_runs(last, out.payload["input_ids"], out.payload["loss_mask"]) == [
        messages[-1]["content"] + "<|im_end|>"
    ]
    every = RenderChat(tokenizer=tok_dirs["chatml"], train_on="all")
    (out,) = render(every, [conv])
    runs = trained_runs(every, out.payload["input_ids"], out.payload["loss_mask"])
    # Adjacent turns: one turn's end token and the next header are separated by an untrained
    # header, so every message is one run.
    assert runs == [m["content"] + "<|im_end|>" for m in messages]


def test_a_turn_of_weight_0_is_not_trained_whatever_train_on_says(tok_dirs):
    # The OpenAI fine-tuning format marks assistant turns not to train with "weight": 0; they
    # were trained (the field reached the template and nothing else).
    def conv(*weights: Any) -> dict[str, Any]:
        messages = []
        for k, w in enumerate(weights):
            messages.append({"role": "user", "content": f"Q{k}?"})
            answer = {"role": "assistant", "content": f"A{k}."}
            messages.append(answer if w is None else {**answer, "weight": w})
        return {"messages": messages}

    op = RenderChat(tokenizer=tok_dirs["chatml"])
    outs = render(op, [conv(0, 1, None), conv(0.0, True), conv(1.0, 0)])
    runs = [trained_runs(op, o.payload["input_ids"], o.payload["loss_mask"]) for o in outs]
    assert runs == [["A1.<|im_end|>", "A2.<|im_end|>"], ["A1.<|im_end|>"], ["A0.<|im_end|>"]]
    every = RenderChat(tokenizer=tok_dirs["chatml"], train_on="all")
    (out,) = render(every, [conv(0, 1)])
    assert trained_runs(every, out.payload["input_ids"], out.payload["loss_mask"]) == [
        "Q0?<|im_end|>",
        "Q1?<|im_end|>",
        "A1.<|im_end|>",
    ]
    with pytest.raises(DataError, match="nothing to learn"):  # every answer switched off
        render(op, [conv(0, 0)])
    with pytest.raises(DataError, match=r"message 1 \(assistant\): 'weight' must be 0"):
        render(op, [conv("0")])
    with pytest.raises(DataError, match=r"'weight' must be 0 \(not trained\) or 1, got 0.5"):
        render(op, [conv(1, 0.5)])
    ignoring = RenderChat(tokenizer=tok_dirs["chatml"], weight_field="train")  # another name
    (out,) = render(ignoring, [conv(0, 1)])
    assert len(trained_runs(ignoring, out.payload["input_ids"], out.payload["loss_mask"])) == 2


def test_template_kwargs_reach_the_template_and_the_fingerprint(tmp_path, tok_dirs):
    template = tmp_path / "greeting.jinja"
    template.write_text("{% if greeting is defined %}{{ greeting }}\n{% endif %}" + CHATML)
    conv = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    plain = RenderChat(tokenizer=tok_dirs["chatml"], template=str(template))
    kind = RenderChat(
        tokenizer=tok_dirs["chatml"], template=str(template), template_kwargs={"greeting": "Hey"}
    )
    texts = [decode(op, render(op, [conv])[0].payload["input_ids"]) for op in (plain, kind)]
    assert texts[1] == "Hey\n" + texts[0]
    assert plain.params()["template_kwargs"] == {} != kind.params()["template_kwargs"]


def test_header_template_trims_content_and_trains_eot(tok_dirs):
    op = RenderChat(tokenizer=tok_dirs["headers"])
    conv = {
        "messages": [
            {"role": "user", "content": "  Where is the river?  "},
            {"role": "assistant", "content": "\nNear the old bridge.\n"},
        ]
    }
    (out,) = render(op, [conv])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    assert trained_runs(op, ids, mask) == ["Near the old bridge.<|eot_id|>"]
    assert decode(op, ids).startswith("<|begin_of_text|><|start_header_id|>user")


def test_inst_template_trains_answer_and_eos_and_its_exception_is_a_chat_error(tok_dirs):
    op = RenderChat(tokenizer=tok_dirs["inst"])
    good = {
        "messages": [
            {"role": "user", "content": "Name a tree."},
            {"role": "assistant", "content": "An oak."},
        ]
    }
    (out,) = render(op, [good])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    assert trained_runs(op, ids, mask) == ["An oak.</s>"]
    assert decode(op, ids) == "<s>[INST] Name a tree. [/INST]An oak.</s>"
    bad = {"messages": [{"role": "assistant", "content": "An oak."}]}
    with pytest.raises(DataError, match="roles must alternate"):
        render(op, [bad])


def test_system_prompt_option_and_empty_assistant_turn(tok_dirs):
    op = RenderChat(tokenizer=tok_dirs["chatml"], system_prompt="Be brief.")
    conv = {
        "messages": [
            {"role": "user", "content": "Say nothing."},
            {"role": "assistant", "content": ""},
        ]
    }
    (out,) = render(op, [conv])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    assert decode(op, ids).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert trained_runs(op, ids, mask) == ["<|im_end|>"]  # the model learns to stop


def test_prompt_completion_trains_completion_and_eos(tok_dirs):
    op = RenderChat(tokenizer=tok_dirs["chatml"])
    (out,) = render(op, [{"prompt": "Question: where?\nAnswer:", "completion": " by the river"}])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    # EOS: tokenizer_config's eos_token (<|im_end|> for this chat tokenizer).
    assert trained_runs(op, ids, mask) == [" by the river<|im_end|>"]
    no_eos = RenderChat(tokenizer=tok_dirs["chatml"], completion_eos=False)
    (out,) = render(no_eos, [{"prompt": "Q:", "completion": " yes"}])
    assert trained_runs(no_eos, out.payload["input_ids"], out.payload["loss_mask"]) == [" yes"]


def test_conversational_prompt_completion_trains_only_the_completions_turns(tok_dirs):
    # TRL's conversational prompt/completion: both fields are lists of messages. The record is
    # one conversation; its prompt (a few-shot exchange included) is never trained.
    prompt = [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3 + 3?"},
    ]
    completion = [{"role": "assistant", "content": "6"}]
    record = {"prompt": prompt, "completion": completion}
    for options in ({}, {"system_prompt": "Be exact."}, {"train_on": "all"}):
        op = RenderChat(tokenizer=tok_dirs["chatml"], **options)
        (out,) = render(op, [record])
        (plain,) = render(op, [{"messages": prompt + completion}])
        ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
        assert ids.tolist() == plain.payload["input_ids"].tolist()
        assert trained_runs(op, ids, mask) == ["6<|im_end|>"], options


def test_a_prompt_and_completion_of_different_kinds_is_a_chat_error(tok_dirs):
    op = RenderChat(tokenizer=tok_dirs["chatml"])
    record = {"prompt": [{"role": "user", "content": "Hi"}], "completion": "Hello"}
    with pytest.raises(DataError, match="both strings, or both lists of messages"):
        render(op, [record])


def test_token_mask_overlap_rule():
    offsets = np.array([[0, 3], [3, 5], [5, 5], [5, 9]])
    assert token_mask(offsets, ((4, 6),)).tolist() == [0, 1, 1, 1]
    assert token_mask(offsets, ((0, 3), (9, 10))).tolist() == [1, 0, 0, 0]
    assert token_mask(offsets, ()).tolist() == [0, 0, 0, 0]


# ---------------------------------------------------------------------------- golden tests

GOLDEN_CONVERSATIONS: dict[str, dict[str, Any]] = {
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "What is a river?"},
            {"role": "assistant", "content": "Water that flows to the sea."},
            {"role": "user", "content": "And a lake?"},
            {"role": "assistant", "content": "Water that stays."},
        ]
    },
    "system_prompt": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi."},
        ]
    },
    "empty_assistant": {
        "messages": [
            {"role": "user", "content": "Reply with nothing."},
            {"role": "assistant", "content": ""},
        ]
    },
    "non_ascii": {
        "messages": [
            {"role": "user", "content": "Wie heißt das Café? 日本語で答えて。"},
            {"role": "assistant", "content": "Es heißt «Über». カフェです 🙂"},
        ]
    },
    "long_turn": {
        "messages": [
            {"role": "user", "content": "Count."},
            {"role": "assistant", "content": " ".join(str(i) for i in range(200))},
        ]
    },
}
MAX_LENGTH = {"byte": 200, "bpe": 96}  # every conversation fits but long_turn

# sha256 of (input_ids int32 bytes + loss_mask bytes), first 16 hex digits, per conversation.
GOLDEN_BYTE = {
    "multi_turn": "99c55014587ffe4d",
    "system_prompt": "908a88f32ae6a425",
    "empty_assistant": "9d4f39f62217c9e1",
    "non_ascii": "d5dad93f50bfce2c",
    "long_turn": "15b191b3a70d6046",
}
# The BPE tokenizer is trained on the spot (chat_helpers); tokenizers' trainer is
# deterministic for the same input, so its tokens are pinned too.
GOLDEN_BPE = {
    "multi_turn": "1f683690c056652f",
    "system_prompt": "eed719fdcace4dfd",
    "empty_assistant": "f352a2a19d8dc491",
    "non_ascii": "0d9212838e580167",
    "long_turn": "10ee735126b37e74",
}


def digest(out: SampleRecord) -> str:
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    return hashlib.sha256(ids.astype("<i4").tobytes() + mask.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_golden_rendered_tokens_and_masks(tmp_path, tok_dirs, tokenizer):
    if tokenizer == "byte":
        template = tmp_path / "chatml.jinja"
        template.write_text(CHATML)
        op = RenderChat(tokenizer="byte", template=str(template), max_length=MAX_LENGTH["byte"])
        golden = GOLDEN_BYTE
    else:
        op = RenderChat(tokenizer=tok_dirs["chatml"], max_length=MAX_LENGTH["bpe"])
        golden = GOLDEN_BPE
    outs = render(op, list(GOLDEN_CONVERSATIONS.values()))
    got = {name: digest(out) for name, out in zip(GOLDEN_CONVERSATIONS, outs)}
    by_name = dict(zip(GOLDEN_CONVERSATIONS, outs))
    for name, conv in GOLDEN_CONVERSATIONS.items():
        out = by_name[name]
        runs = trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"])
        answers = [m["content"] for m in conv["messages"] if m["role"] == "assistant"]
        if name == "long_turn":  # cut at max_length: the kept part of the answer is trained
            assert len(out.payload["input_ids"]) == MAX_LENGTH[tokenizer]
            assert len(runs) == 1 and answers[0].startswith(runs[0]) and len(runs[0]) > 20
        else:
            assert runs == [a + "<|im_end|>" for a in answers], name
    assert got == golden, got


# ------------------------------------------------------------------------ templates found


def test_template_sources(tmp_path):
    named = [
        {"name": "tool_use", "template": "{{ 'tools' }}"},
        {"name": "default", "template": CHATML},
    ]
    path = chat_tokenizer(tmp_path / "list", chat_template=named)
    assert "im_start" in RenderChat(tokenizer=path).source.text
    path = chat_tokenizer(tmp_path / "jinja", chat_template=None)
    with pytest.raises(ConfigError, match="no chat template"):
        RenderChat(tokenizer=path)
    (tmp_path / "jinja" / "chat_template.jinja").write_text(CHATML)
    assert RenderChat(tokenizer=path).source.origin.endswith("chat_template.jinja")
    own = tmp_path / "own.jinja"
    own.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert RenderChat(tokenizer=path, template=str(own)).source.origin == str(own)
    fingerprints = {RenderChat(tokenizer=path).params()["template"]}
    fingerprints.add(RenderChat(tokenizer=path, template=str(own)).params()["template"])
    assert len(fingerprints) == 2  # the template enters the pipeline fingerprint
    own.write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="syntax error"):
        RenderChat(tokenizer=path, template=str(own))


def test_strftime_now_uses_the_configured_date(tmp_path):
    template = tmp_path / "dated.jinja"
    template.write_text(
        "Today: {{ strftime_now('%d %b %Y') }}\n"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<end>\n{% endfor %}"
    )
    op = RenderChat(tokenizer="byte", template=str(template), date="2024-07-26")
    conv = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    (out,) = render(op, [conv])
    assert decode(op, out.payload["input_ids"]).startswith("Today: 26 Jul 2024\n")
    assert trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"]) == ["a<end>"]


@pytest.mark.parametrize(
    "text",
    [
        "{{ messages | random }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "{% for m in messages %}{{ m.content }}{{ lipsum(1) }}{% endfor %}",
    ],
)
def test_a_template_drawing_random_values_is_a_config_error(tmp_path, text):
    template = tmp_path / "random.jinja"
    template.write_text(text)
    with pytest.raises(ConfigError, match="draws random values"):
        RenderChat(tokenizer="byte", template=str(template))


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"train_on": "assistants"}, "train_on must be one of"),
        ({"max_length": 0}, "max_length must be an integer >= 1"),
        ({"date": "yesterday"}, "date must be an ISO date"),
        ({"messages_field": ""}, "messages_field must be a non-empty string"),
        ({"reasoning_field": 3}, "reasoning_field must be a non-empty string"),
        ({"reasoning_field": "content"}, "reasoning_field must name the field holding"),
        ({"reasoning_field": "tool_calls"}, "not its 'tool_calls'"),
        ({"weight_field": "role"}, "weight_field must name a message's 0-or-1"),
        ({"template_kwargs": ["x"]}, "template_kwargs must be a mapping"),
        ({"template_kwargs": {"tools": []}}, "may not set 'tools'"),
        ({"template_kwargs": {"strftime_now": "x"}}, "may not set 'strftime_now'"),
        ({"template_kwargs": {"a b": 1}}, "'a b' is not a variable name"),
        ({"template_kwargs": {"x": float("nan")}}, "template_kwargs.x must be"),
        ({"train_reasoning": "yes"}, "train_reasoning must be true or false"),
        ({"completion_eos": 1}, "completion_eos must be true or false"),
    ],
)
def test_bad_parameters_are_config_errors(tok_dirs, params, match):
    with pytest.raises(ConfigError, match=match):
        RenderChat(tokenizer=tok_dirs["chatml"], **params)


# ------------------------------------------------------------------ bad records, on_error

BAD_ROWS: dict[int, tuple[Any, str]] = {
    2: (b'{"messages": [', "malformed"),
    4: ({"text": "no messages here"}, "chat_error"),
    6: ({"messages": [{"role": "user", "content": ["parts"]}]}, "chat_error"),
    8: ({"messages": [{"role": "user", "content": "only a question"}]}, "mask_empty"),
    10: ({"prompt": "", "completion": "everything trained"}, "mask_full"),
    12: ({"messages": "not a list"}, "chat_error"),
    14: (
        {
            "messages": [
                {"role": "system", "content": "word " * 200},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ]
        },
        "mask_truncated",
    ),
    16: (
        {
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "extra": 1,
        },
        "",
    ),
}
FIX_TEXT = {
    "malformed": "bad JSON",
    "chat_error": "fix the record or the chat template",
    "mask_empty": "nothing to learn",
    "mask_full": "every token of this prompt/completion record would be trained",
    "mask_truncated": "raise render_chat.max_length",
}


def bad_corpus(tmp_path: Path) -> tuple[Path, list[Any]]:
    convs: list[Any] = list(generate_conversations(20, seed=11))
    for row, (value, _) in BAD_ROWS.items():
        convs[row] = value
    path = write_jsonl(tmp_path / "bad" / "chat.jsonl", convs)
    return path, convs


def chat_config(path: Path, tok: str, on_error: str, runner: str = "inline", workers: int = 1):
    data = {
        "seed": 5,
        "lanes": 2,
        "chunk_size": 4,
        "flush_every_k_chunks": 2,
        "end_of_data": "longest",  # every record reaches a batch or a skip of its own
        "datasets": [{"name": "chat", "path": str(path), "weight": 1.0, "on_error": on_error}],
        "pipeline": [
            {"render_chat": {"tokenizer": tok, "max_length": 64}},
            {"batch": {"microbatch_size": 2, "drop_last": False}},
        ],
        "execution": {"runner": runner, "workers": workers},
    }
    return parse_config(yaml.safe_load(yaml.safe_dump(data)))


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_bad_records_are_skipped_and_counted_with_their_reasons(tmp_path, tok_dirs, runner):
    path, _ = bad_corpus(tmp_path)
    pipe, execution = chat_config(path, tok_dirs["chatml"], "skip", runner, 2)
    run = pipe.run(execution)
    dtypes: set[np.dtype] = set()
    rows, tombstones = rows_and_tombstones(run, lambda b: dtypes.add(b.tensors["loss_mask"].dtype))
    assert dtypes == {np.dtype(np.uint8)}
    expected = {(row, reason) for row, (_, reason) in BAD_ROWS.items() if reason}
    assert set(tombstones) == expected and set(tombstones.values()) == {1}
    assert rows == set(range(20)) - {row for row, _ in expected}
    stats = run.stats()
    assert stats["skipped"] == {"chat": len(expected)}
    assert {reason: n for reason, n in stats["tombstones"].items()} == Counter(
        reason for _, reason in expected
    )


@pytest.mark.parametrize("row", sorted(r for r, (_, reason) in BAD_ROWS.items() if reason))
def test_bad_record_fails_naming_file_line_reason_and_fix(tmp_path, tok_dirs, row):
    path, convs = bad_corpus(tmp_path)
    good = generate_conversations(20, seed=11)
    convs = [convs[i] if i == row else good[i] for i in range(20)]
    write_jsonl(path, convs)
    pipe, execution = chat_config(path, tok_dirs["chatml"], "fail")
    with pytest.raises(DataError) as info:
        for _ in pipe.run(execution):
            pass
    message = str(info.value)
    assert message.startswith(f"dataset 'chat': {path}:line {row + 1}: "), message
    assert FIX_TEXT[BAD_ROWS[row][1]] in message
    assert "set on_error: skip on dataset 'chat'" in message


def test_a_turn_rendered_differently_when_last_is_still_attributed(tmp_path):
    # The last turn renders differently from earlier ones (as Qwen3's final assistant turn
    # opens with an empty <think> block): contents are placed in the full rendering, so the
    # earlier assistant turn is attributed all the same.
    template = tmp_path / "last.jinja"
    template.write_text(
        "{% for m in messages %}{% if loop.last %}{{ m['role'] }}: {{ m['content'] }}|"
        "{% else %}{{ m['role'] | upper }}: {{ m['content'] }}|{% endif %}{% endfor %}"
    )
    op = RenderChat(tokenizer="byte", template=str(template))
    conv = {"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}
    (out,) = render(op, [conv])
    ids, mask = out.payload["input_ids"], out.payload["loss_mask"]
    assert decode(op, ids) == "ASSISTANT: a|user: b|"
    assert trained_runs(op, ids, mask) == ["a|"]


PEEKING = {
    # The header changes with the content: where the content sits cannot be told apart from
    # what the template wrote because of it.
    "before": (
        "{% for m in messages %}{% if 'x' in m['content'] %}!{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}|{% endfor %}",
        ["q", "a x"],
        r"message 1 \(assistant\): .* differently depending on its content",
    ),
    # What follows message 1's content changes with it: the text that differs lies between
    # the contents of messages 1 and 3, and the error names both.
    "after": (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
        "{% if 'x' in m['content'] %}!{% endif %}|{% endfor %}",
        ["q", "ax", "r", "b"],
        r"messages 1 \(assistant\) to 3 \(assistant\): the chat template writes the text "
        r"between their contents differently",
    ),
}


@pytest.mark.parametrize("where", sorted(PEEKING))
def test_text_around_a_turn_that_depends_on_its_content_is_a_chat_error(tmp_path, where):
    text, contents, error = PEEKING[where]
    template = tmp_path / "peeking.jinja"
    template.write_text(text)
    op = RenderChat(tokenizer="byte", template=str(template))
    roles = ("user", "assistant") * 2
    conv = {"messages": [{"role": r, "content": c} for r, c in zip(roles, contents)]}
    with pytest.raises(DataError, match=error):
        render(op, [conv])


# ------------------------------------------------------------ a real pipeline, every runner


def chain_digests(pipe, execution) -> dict[int, list[str]]:
    chains: dict[int, list[str]] = {}
    for batch in pipe.run(execution).batches():
        chains.setdefault(batch.lane_id, []).append(batch.chain_digest.hex())
        mask, pad = batch.tensors["loss_mask"], batch.tensors["padding_mask"]
        assert mask.dtype == np.uint8 and 0 < int(mask.sum()) < int(pad.sum())
        assert not np.any(mask[~pad.astype(bool)])  # padding is never trained
    return chains


def test_render_chat_replaces_decode_and_tokenize(tmp_path, tok_dirs):
    path, _ = bad_corpus(tmp_path)
    base = {
        "datasets": [{"name": "chat", "path": str(path), "weight": 1.0}],
        "pipeline": [
            {"decode_text": {}},
            {"render_chat": {"tokenizer": tok_dirs["chatml"]}},
            {"batch": {}},
        ],
    }
    pipe, execution = parse_config(base)
    with pytest.raises(ConfigError, match="'render_chat' replaces 'decode_text' and 'tokenize'"):
        pipe.plan(execution)


def test_byte_offsets_from_token_lengths_equal_the_tokenizers_offsets(tok_dirs):
    """For a byte-level BPE the offsets come from token byte lengths. They give the same mask
    as the tokenizer's own character offsets for every range of whole characters (a token
    holding part of a character differs only inside that character), non-ASCII and special
    tokens included."""
    from zephon_server.engine.token_offsets import byte_ranges
    from zephon_server.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dirs["chatml"])
    assert tok.byte_lengths is not None  # the fast path is taken
    op = RenderChat(tokenizer=tok_dirs["chatml"])
    texts = [op.chat_template.render(c["messages"]) for c in generate_conversations(30, seed=6)]
    texts += [
        "<|im_start|>user\nWie heißt das Café? 日本語 🙂<|im_end|>\n",
        "  leading spaces and trailing  ",
        "",
    ]
    fast = tok.encode_offsets(texts)
    slow = tok._tokenizer_offsets(texts)
    rng = np.random.default_rng(0)
    for text, (ids_a, off_a), (ids_b, off_b) in zip(texts, fast, slow):
        assert ids_a.tolist() == ids_b.tolist()
        for _ in range(20):
            lo, hi = sorted(rng.integers(0, len(text) + 1, size=2).tolist())
            ranges = byte_ranges(text, [(lo, hi)])
            assert token_mask(off_a, ranges).tolist() == token_mask(off_b, ranges).tolist()


def test_tokenizer_offsets_are_used_when_lengths_do_not_tile_the_text(tmp_path):
    """A prefix space (ByteLevel add_prefix_space) breaks the byte-length shortcut: the
    tokenizer's offsets are used, and the mask is still exact."""
    from tokenizers import Tokenizer, pre_tokenizers

    from tests.support.chat_helpers import trained_tokenizer_json

    tok = Tokenizer.from_str(trained_tokenizer_json())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    directory = tmp_path / "prefix"
    chat_tokenizer(directory)
    tok.save(str(directory / "tokenizer.json"))
    op = RenderChat(tokenizer=str(directory / "tokenizer.json"))
    assert op.tokenizer.byte_lengths is None
    conv = generate_conversations(3, seed=2)[1]
    (out,) = render(op, [conv])
    runs = trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"])
    answers = [m["content"] for m in conv["messages"] if m["role"] == "assistant"]
    assert [r.strip() for r in runs] == [a + "<|im_end|>" for a in answers]


def test_generation_blocks_and_the_message_bound(tmp_path):
    template = tmp_path / "generation.jinja"
    template.write_text(
        "{% for m in messages %}{{ m['role'] }}: "
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<eot>"
        "{% endgeneration %}{% else %}{{ m['content'] }}<eot>{% endif %}\n{% endfor %}"
    )
    op = RenderChat(tokenizer="byte", template=str(template), max_messages=3)
    conv = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    (out,) = render(op, [conv])
    assert trained_runs(op, out.payload["input_ids"], out.payload["loss_mask"]) == ["a<eot>"]
    too_long = {"messages": conv["messages"] * 2}
    with pytest.raises(
        DataError, match=r"has 4 messages, more than 3 \(render_chat.max_messages\)"
    ):
        render(op, [too_long])


def test_an_empty_contents_stand_in_is_written_as_its_marker_and_answers_as_empty():
    from zephon_server.engine.chat_trace import EmptyStandIn, stand_in

    s = stand_in("\ue000m\ue002", "")
    assert isinstance(s, EmptyStandIn) and stand_in("\ue000m\ue002", "text") == "\ue000m\ue002"
    assert not s and len(s) == 0 and s == "" and s != "x" and hash(s) == hash("")
    assert "" in s and "x" not in s and "m" not in s
    assert not s.startswith("\ue000") and not s.endswith("\ue002") and s.startswith("")
    assert s.strip() is s and s.lstrip("\n") is s and s.rstrip() is s
    assert "".join(["a", s, "b"]) == "a\ue000m\ue002b"  # written out: the marker
    assert "a" + s == "a\ue000m\ue002"


def test_the_layout_rule_enters_the_fingerprint(tok_dirs, monkeypatch):
    # Records the earlier rule refused (and skipped) render now: a checkpoint taken under it
    # must be refused, not resumed into another stream.
    from zephon_server.engine.datasets import DatasetSpec
    from zephon_server.engine.ops import render_chat
    from zephon_server.engine.pipeline import Pipeline, fingerprint

    def pipeline_fingerprint() -> str:
        pipe = Pipeline([DatasetSpec("chat", "chat.jsonl", 1.0)], seed=1, lanes=2)
        pipe.add("render_chat", tokenizer=tok_dirs["chatml"])
        return fingerprint(pipe, [])

    now = pipeline_fingerprint()
    monkeypatch.setattr(render_chat, "LAYOUT_VERSION", render_chat.LAYOUT_VERSION - 1)
    assert pipeline_fingerprint() != now


def test_a_reasoning_the_template_never_writes_is_a_chat_error(tok_dirs):
    # ChatML (as Qwen2.5's and Llama 3.2's templates) never names reasoning_content: the
    # reasoning would be missing from the tokens without a word, as tool calls would.
    op = RenderChat(tokenizer=tok_dirs["chatml"])
    turns = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    thinking = [turns[0], {**turns[1], "reasoning_content": "Because."}]
    empty = [turns[0], {**turns[1], "reasoning_content": "\n"}]
    with pytest.raises(DataError) as refused:
        render(op, [{"messages": thinking}])
    text = str(refused.value)
    assert "message 1 (assistant) has a 'reasoning_content'" in text
    assert "point render_chat.reasoning_field at a field the records do not have" in text
    plain, blank = render(op, [{"messages": turns}, {"messages": empty}])
    assert plain.payload["input_ids"].tolist() == blank.payload["input_ids"].tolist()
    # Pointing reasoning_field elsewhere leaves the field out on purpose.
    other = RenderChat(tokenizer=tok_dirs["chatml"], reasoning_field="thoughts")
    (out,) = render(other, [{"messages": thinking}])
    assert out.payload["input_ids"].tolist() == plain.payload["input_ids"].tolist()


def test_a_template_failing_on_a_plain_conversation_is_named_at_construction(tmp_path, caplog):
    path = tmp_path / "raises.jinja"
    path.write_text("{{ raise_exception('this template renders nothing') }}")
    RenderChat(tokenizer="byte", template=str(path))
    assert "fails on a plain conversation of a user turn and an answer" in caplog.text
    assert "this template renders nothing" in caplog.text
    caplog.clear()
    path.write_text(CHATML)
    RenderChat(tokenizer="byte", template=str(path))
    assert "fails on a plain conversation" not in caplog.text


def test_a_tokenizer_directory_and_a_list_of_parts_name_their_fixes(tmp_path, tok_dirs):
    directory = str(Path(tok_dirs["chatml"]).parent)
    with pytest.raises(ConfigError, match=f"is a directory.*give '{directory}/tokenizer.json'"):
        RenderChat(tokenizer=directory)
    op = RenderChat(tokenizer=tok_dirs["chatml"])
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    with pytest.raises(DataError, match=r"a list of parts.*join the text parts"):
        render(op, [parts])
