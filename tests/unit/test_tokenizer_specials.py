"""The BOS, EOS and pad ids of a Hugging Face tokenizer, as Hugging Face reads them.

A tokenizer.json does not say which of its tokens ends a document; the
``tokenizer_config.json`` beside it does (``eos_token``; ``null`` for none). Without one,
only tokens the tokenizer marks special are taken: guessing by name took Qwen's ``</s>``, an
ordinary piece of its vocabulary, as its EOS (appended to every document by ``tokenize``),
and found no EOS at all for Llama 3, whose -1 was then appended as a token id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon_server.engine.errors import ConfigError
from zephon_server.engine.ops.tokenize import Tokenize
from zephon_server.engine.tokenizer import HFTokenizer, load_tokenizer

REAL = Path(__file__).resolve().parents[2] / "build" / "tokenizers"


def token(tok: HFTokenizer, tid: int) -> str | None:
    return None if tid < 0 else str(tok._tok.id_to_token(tid))


@pytest.mark.parametrize(
    ("name", "bos", "eos", "pad"),
    [
        ("qwen3", None, "<|im_end|>", "<|endoftext|>"),
        ("llama3_2", "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"),
    ],
)
def test_the_config_beside_the_tokenizer_names_its_special_tokens(name, bos, eos, pad):
    path = REAL / name / "tokenizer.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make tokenizers` (`make test` does)")
    tok = load_tokenizer(str(path))
    assert (token(tok, tok.bos_id), token(tok, tok.eos_id), token(tok, tok.pad_id)) == (
        bos,
        eos,
        pad,
    )


def small_tokenizer(directory: Path, config: dict | None = None) -> str:
    """A word-level tokenizer whose vocabulary has ``</s>`` and ``<s>`` as ordinary pieces
    and ``<|endoftext|>`` as its one special token (as Qwen's has)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "</s>": 2, "<s>": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return str(directory / "tokenizer.json")


def test_without_a_config_only_special_tokens_are_taken(tmp_path):
    tok = HFTokenizer(small_tokenizer(tmp_path))
    assert token(tok, tok.eos_id) == "<|endoftext|>" and tok.bos_id == -1
    assert tok.pad_id == tok.eos_id  # no pad token: the EOS pads


def test_tokenize_refuses_a_bos_or_eos_the_tokenizer_does_not_have(tmp_path):
    with pytest.raises(ConfigError, match=r"add_bos: the tokenizer .* has no BOS token"):
        Tokenize(tokenizer=small_tokenizer(tmp_path / "bare"), add_bos=True)
    path = small_tokenizer(tmp_path / "none", {"eos_token": None, "pad_token": "a"})
    with pytest.raises(ConfigError, match=r"add_eos: .* has no EOS token.*set add_eos: false"):
        Tokenize(tokenizer=path)
    op = Tokenize(tokenizer=path, add_eos=False)
    assert op.params()["special_ids"] == [-1, -1, 1]  # the ids enter the fingerprint


def test_a_config_token_missing_from_the_vocabulary_is_none_with_a_warning(tmp_path, caplog):
    path = small_tokenizer(tmp_path, {"bos_token": "<|begin|>", "eos_token": "<|endoftext|>"})
    tok = HFTokenizer(path)
    assert tok.bos_id == -1 and token(tok, tok.eos_id) == "<|endoftext|>"
    assert "names bos_token '<|begin|>', which is not in its vocabulary" in caplog.text
