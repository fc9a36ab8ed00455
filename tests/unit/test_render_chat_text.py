"""``render_chat.text_datasets``: pretraining text mixed into a chat pipeline is tokenized as
``decode_text`` + ``tokenize`` make it and trained whole, while the conversations beside it
render exactly as in a chat-only pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chat_helpers import chat_tokenizer
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_jsonl, write_parquet
from zephon_server.engine.errors import ConfigError, DataError
from zephon_server.engine.ops.render_chat import RenderChat
from zephon_server.engine.tokenizer import load_tokenizer

TEXTS = [f"plain document {i}: " + "the harbor and the tower " * (i % 5 + 1) for i in range(20)]
TEXTS[3] = "naïve café, jalapeño \u2014 über"  # non-ASCII


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return chat_tokenizer(tmp_path_factory.mktemp("tok") / "chatml")


@pytest.fixture
def corpora(tmp_path) -> dict[str, Path]:
    write_jsonl(tmp_path / "chat" / "c.jsonl", generate_conversations(16, seed=5))
    write_jsonl(tmp_path / "web" / "w.jsonl", [{"body": t, "id": i} for i, t in enumerate(TEXTS)])
    return {"chat": tmp_path / "chat", "web": tmp_path / "web"}


def documents(datasets: list[dict[str, Any]], first: dict[str, Any]) -> dict[tuple, tuple]:
    """(dataset name, row) -> (ids, loss mask or None) of every document the pipeline makes
    (a document in pieces: (name, row, first token) for each piece after the first)."""
    data = {
        "lanes": 1,
        "chunk_size": 4,
        "datasets": [{"weight": 1.0, **d} for d in datasets],
        "pipeline": [first, {"batch": {"microbatch_size": 1, "drop_last": False}}],
    }
    pipe, execution = parse_config(data)
    names = [d["name"] for d in datasets]
    out = {}
    for batch in pipe.run(execution).batches():
        pad = batch.tensors["padding_mask"][0]
        mask = batch.tensors.get("loss_mask")
        (meta,) = batch.rows
        ids = batch.tensors["input_ids"][0][pad].tolist()
        start = meta.spans[0].start
        key = (names[meta.doc.dataset], meta.doc.row) + ((start,) if start else ())
        out[key] = (
            ids,
            None if mask is None else mask[0][pad].tolist(),
        )
    return out


def test_text_records_are_tokenized_as_tokenize_does_and_trained_whole(corpora, tokenizer):
    chat = {"name": "chat", "path": str(corpora["chat"])}
    web = {"name": "web", "path": str(corpora["web"]), "text_field": "body"}
    mixed = documents(
        [chat, web], {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["web"]}}
    )
    plain = documents([web], {"tokenize": {"tokenizer": tokenizer}})
    alone = documents([chat], {"render_chat": {"tokenizer": tokenizer}})
    assert len(plain) == len(TEXTS) and len(alone) == 16
    for (_, row), (ids, _) in plain.items():
        assert mixed["web", row] == (ids, [1] * len(ids))  # EOS appended and trained, as tokenize
    assert {key: value for key, value in mixed.items() if key[0] == "chat"} == alone
    # text_eos: false leaves the EOS out
    bare = documents([web], {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["web"]}})
    no_eos = documents(
        [web],
        {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["web"], "text_eos": False}},
    )
    assert all(no_eos[key][0] == ids[:-1] for key, (ids, _) in bare.items())


def test_parquet_text_beside_parquet_conversations(tmp_path, tokenizer):
    convs = generate_conversations(8, seed=2)
    write_parquet(tmp_path / "chat" / "c.parquet", [{"messages": c["messages"]} for c in convs])
    write_parquet(tmp_path / "web" / "w.parquet", [{"text": t} for t in TEXTS])
    chat = {"name": "chat", "path": str(tmp_path / "chat"), "text_field": "messages"}
    web = {"name": "web", "path": str(tmp_path / "web")}
    op = {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["web"]}}
    mixed = documents([chat, web], op)
    plain = documents([web], {"tokenize": {"tokenizer": tokenizer}})
    assert sum(key[0] == "chat" for key in mixed) == 8
    assert all(mixed["web", row] == (ids, [1] * len(ids)) for (_, row), (ids, _) in plain.items())


def test_a_text_record_without_text_fails_naming_its_file_and_line(corpora, tokenizer):
    write_jsonl(corpora["web"] / "bad.jsonl", [{"body": "fine"}, {"title": "no body"}])
    web = {"name": "web", "path": str(corpora["web"] / "bad.jsonl"), "text_field": "body"}
    with pytest.raises(
        DataError, match=r"bad\.jsonl:line 2: render_chat: missing text field 'body'"
    ):
        documents([web], {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["web"]}})


def test_without_text_datasets_plain_text_is_a_chat_error_naming_the_option(corpora, tokenizer):
    web = {"name": "web", "path": str(corpora["web"]), "text_field": "body"}
    with pytest.raises(DataError, match=r"render_chat\.text_datasets names it"):
        documents([web], {"render_chat": {"tokenizer": tokenizer}})


def test_text_datasets_must_name_the_pipelines_datasets_when_the_plan_is_made(corpora, tokenizer):
    web = {"name": "web", "path": str(corpora["web"]), "text_field": "body", "weight": 1.0}
    data = {
        "datasets": [web],
        "pipeline": [
            {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["webb"]}},
            {"batch": {}},
        ],
    }
    pipe, execution = parse_config(data)
    with pytest.raises(ConfigError, match=r"unknown dataset 'webb'; the pipeline's datasets are"):
        pipe.plan(execution)  # as zephon explain and a server's start-up make it
    data["pipeline"][0] = {"render_chat": {"tokenizer": tokenizer}}
    data["pipeline"].insert(1, {"ensure_mixture": {"weights": {"wbe": 1.0}}})
    pipe, execution = parse_config(data)
    with pytest.raises(ConfigError, match="weights names unknown dataset 'wbe'"):
        pipe.plan(execution)
    with pytest.raises(ConfigError, match="text_datasets must be a list of dataset names"):
        RenderChat(tokenizer=tokenizer, text_datasets="web")  # type: ignore[arg-type]


def test_text_bos_and_eos_need_the_tokenizers_tokens(tokenizer, tmp_path):
    # as tokenize refuses add_bos / add_eos (a null in tokenizer_config.json: no such token)
    no_bos = chat_tokenizer(tmp_path / "no-bos", bos_token=None)
    with pytest.raises(ConfigError, match=r"text_bos: the tokenizer .* has no BOS token"):
        RenderChat(tokenizer=no_bos, text_datasets=["web"], text_bos=True)
    no_eos = chat_tokenizer(tmp_path / "no-eos", eos_token=None)
    with pytest.raises(ConfigError, match=r"text_eos: .* has no EOS token.*set text_eos: false"):
        RenderChat(tokenizer=no_eos, text_datasets=["web"])
    RenderChat(tokenizer=no_eos, text_datasets=["web"], text_eos=False)
    RenderChat(tokenizer=no_eos)  # without text datasets the option is not used


def test_the_fingerprint_changes_only_for_pipelines_with_text_datasets(tokenizer):
    plain = RenderChat(tokenizer=tokenizer).params()
    assert "text" not in plain  # checkpoints of existing chat pipelines stay valid
    mixed = RenderChat(tokenizer=tokenizer, text_datasets=["web", "b", "web"], text_eos=False)
    text = {"datasets": ["b", "web"], "bos": False, "eos": False}  # a set of names
    assert mixed.params() == {**plain, "text": text}


def test_zephon_dump_decoded_shows_text_trained_whole_and_chat_headers_untrained(
    corpora, tokenizer, tmp_path, capsys
):
    from zephon_server.cli import main

    config = tmp_path / "mixed.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "lanes": 1,
                "chunk_size": 4,
                "datasets": [
                    {"name": "chat", "path": str(corpora["chat"]), "weight": 1.0},
                    {
                        "name": "web",
                        "path": str(corpora["web"]),
                        "weight": 1.0,
                        "text_field": "body",
                    },
                ],
                "pipeline": [
                    {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["web"]}},
                    {"batch": {"microbatch_size": 1, "drop_last": False}},
                ],
                "execution": {"runner": "inline"},
            }
        )
    )
    assert main(["dump", "--config", str(config), "--batches", "40", "--format", "decoded"]) == 0
    lines = capsys.readouterr().out.splitlines()
    docs = [line.removeprefix("    doc 0: ") for line in lines if line.startswith("    doc 0: ")]
    texts = [d for d in docs if d.startswith("train:")]  # a text: one run, all of it trained
    chats = [d for d in docs if d.startswith("'<|im_start|>")]
    assert (len(texts), len(chats), len(docs)) == (20, 16, 36)
    assert all(" '" not in d and " train:" not in d for d in texts)
    assert all("<|im_start|>assistant\\n' train:" in d for d in chats)


def test_max_length_splits_a_text_as_tokenize_does_and_cuts_a_conversation(corpora, tokenizer):
    long = [{"body": " ".join(TEXTS[i : i + 6])} for i in range(0, 20, 2)]  # 100-200 tokens
    write_jsonl(corpora["web"] / "w.jsonl", long)
    chat = {"name": "chat", "path": str(corpora["chat"]), "on_error": "skip"}  # mask_truncated
    web = {"name": "web", "path": str(corpora["web"]), "text_field": "body"}
    op = {"tokenizer": tokenizer, "text_datasets": ["web"], "max_length": 64}
    mixed = documents([chat, web], {"render_chat": op})
    plain = documents([web], {"tokenize": {"tokenizer": tokenizer, "max_length": 64}})
    assert sum(len(key) == 3 for key in plain) >= 10  # the texts come in pieces
    assert {key: value for key, value in mixed.items() if key[0] == "web"} == {
        key: (ids, [1] * len(ids)) for key, (ids, _) in plain.items()
    }
    chats = [ids for key, (ids, _) in mixed.items() if key[0] == "chat"]
    assert len(chats) >= 8 and max(map(len, chats)) == 64 and all(len(i) <= 64 for i in chats)


def test_text_bos_puts_the_tokenizers_bos_first_trained(corpora, tmp_path):
    headers = chat_tokenizer(tmp_path / "headers", "headers")  # BOS <|begin_of_text|>
    web = {"name": "web", "path": str(corpora["web"]), "text_field": "body"}
    op = {"tokenizer": headers, "text_datasets": ["web"], "text_bos": True}
    got = documents([web], {"render_chat": op})
    plain = documents([web], {"tokenize": {"tokenizer": headers, "add_bos": True}})
    assert got == {key: (ids, [1] * len(ids)) for key, (ids, _) in plain.items()}
    assert {ids[0] for ids, _ in got.values()} == {load_tokenizer(headers).bos_id}


def test_a_chat_dataset_named_as_text_is_named_in_the_message(corpora, tokenizer):
    chat = {"name": "chat", "path": str(corpora["chat"])}
    op = {"tokenizer": tokenizer, "text_datasets": ["chat"]}
    with pytest.raises(DataError) as info:
        documents([chat], {"render_chat": op})
    assert "missing text field 'text'" in str(info.value)
    assert "dataset 'chat' is in render_chat.text_datasets but its records are conversations (" in (
        str(info.value)
    )


def test_a_text_record_that_is_also_a_conversation_is_warned_about_once(
    tmp_path, tokenizer, caplog
):
    convs = generate_conversations(6, seed=1)
    rows = [{"messages": c["messages"], "text": f"rendered {i}"} for i, c in enumerate(convs)]
    write_jsonl(tmp_path / "both" / "b.jsonl", rows)
    both = {"name": "both", "path": str(tmp_path / "both")}
    with caplog.at_level("WARNING"):
        got = documents(
            [both], {"render_chat": {"tokenizer": tokenizer, "text_datasets": ["both"]}}
        )
    assert len(got) == 6  # pre-rendered text beside its messages: trained, and said so once
    said = [r.getMessage() for r in caplog.records if "also a conversation" in r.getMessage()]
    assert len(said) == 1 and "b.jsonl:line " in said[0] and "text_datasets" in said[0]


def test_plain_text_in_a_parquet_chat_column_names_text_datasets(tmp_path, tokenizer):
    write_parquet(tmp_path / "web" / "w.parquet", [{"text": t} for t in TEXTS])
    web = {"name": "web", "path": str(tmp_path / "web")}
    with pytest.raises(DataError) as info:
        documents([web], {"render_chat": {"tokenizer": tokenizer}})
    assert "bad JSON" in str(info.value) and "render_chat.text_datasets names its dataset" in str(
        info.value
    )


def test_an_empty_text_names_the_fix_for_texts(tmp_path, tokenizer):
    write_jsonl(tmp_path / "web" / "w.jsonl", [{"text": "fine"}, {"text": ""}])
    web = {"name": "web", "path": str(tmp_path / "web")}
    op = {"tokenizer": tokenizer, "text_datasets": ["web"], "text_eos": False}
    with pytest.raises(DataError) as info:
        documents([web], {"render_chat": op})
    text = str(info.value)
    assert "(an empty text without text_eos)" in text and "train_on" not in text
    assert "remove empty texts from the dataset, or set render_chat.text_eos: true" in text
