"""Loss masks of a micro-batch at once: exactly the masks of each text from its offsets.

:func:`zephon_server.engine.token_masks.encode_masks` marks the tokens of every trained range
of every text together when the tokens tile the texts; these tests compare it with
:func:`token_mask` on each text's own offsets, for the byte tokenizer, a trained byte-level
BPE, Qwen3's real tokenizer (NFC and not), and a tokenizer whose tokens do not tile a text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.chat_helpers import trained_tokenizer_json
from zephon_server.engine.chat_corpus import generate_conversations
from zephon_server.engine.token_masks import encode_masks, tiled_masks, token_mask
from zephon_server.engine.token_offsets import byte_ranges
from zephon_server.engine.tokenizer import ByteTokenizer, HFTokenizer

QWEN3 = Path(__file__).resolve().parents[2] / "build" / "tokenizers" / "qwen3" / "tokenizer.json"


def texts() -> list[str]:
    convs = generate_conversations(40, seed=3, mean_words=20)
    out = ["\n".join(m["content"] for m in c["messages"]) for c in convs]
    out += [
        "",
        "a",
        "<|im_start|>user\nWie heißt das Café? 日本語 🙂<|im_end|>\n",
        "Cafe\u0301 is not NFC",  # an NFC normalizer changes it: the tokens do not tile it
        "  leading spaces and trailing  ",
        "x" * 500,
    ]
    return out


def random_ranges(text: str, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Sorted, disjoint character ranges (some empty, some at the ends of the text)."""
    cuts = sorted(rng.integers(0, len(text) + 1, size=2 * int(rng.integers(0, 4))).tolist())
    pairs = list(zip(cuts[::2], cuts[1::2]))
    if text and rng.random() < 0.3:
        pairs = [(0, len(text))]
    return pairs


def per_text(tok, batch: list[str], ranges) -> list[list[int]]:
    return [
        token_mask(offsets, r).tolist()
        for (_, offsets), r in zip(tok.encode_offsets(batch), ranges)
    ]


def tokenizers(tmp_path: Path) -> dict[str, object]:
    path = tmp_path / "bpe.json"
    path.write_text(trained_tokenizer_json())
    out: dict[str, object] = {"byte": ByteTokenizer(), "bpe": HFTokenizer(str(path))}
    if not QWEN3.exists():
        pytest.fail(f"{QWEN3} is missing: run `make tokenizers` (`make test` does)")
    out["qwen3"] = HFTokenizer(str(QWEN3))
    return out


@pytest.mark.parametrize("name", ["byte", "bpe", "qwen3"])
def test_batch_masks_equal_each_texts_mask_from_its_offsets(tmp_path, name):
    tok = tokenizers(tmp_path)[name]
    assert tok.byte_lengths is not None  # the batched path is the one under test
    batch = texts()
    rng = np.random.default_rng(7)
    for _ in range(5):
        ranges = [byte_ranges(t, random_ranges(t, rng)) for t in batch]
        got = encode_masks(tok, batch, ranges)
        assert [m.tolist() for _, m in got] == per_text(tok, batch, ranges)
        assert [ids.tolist() for ids, _ in got] == [ids.tolist() for ids in tok.encode_batch(batch)]


def test_a_text_whose_tokens_do_not_tile_it_falls_back_to_the_tokenizers_offsets():
    if not QWEN3.exists():
        pytest.fail(f"{QWEN3} is missing: run `make tokenizers` (`make test` does)")
    tok = HFTokenizer(str(QWEN3))
    batch = ["plain text", "Cafe\u0301 au lait", "more text"]
    ids = tok.encode_batch(batch)
    masks = tiled_masks(ids, batch, [[(0, 3)]] * 3, tok.byte_lengths)
    assert masks[1] is None and masks[0] is not None and masks[2] is not None
    ranges = [byte_ranges(t, [(0, 3)]) for t in batch]
    assert [m.tolist() for _, m in encode_masks(tok, batch, ranges)] == per_text(tok, batch, ranges)


def counted(tok) -> dict[str, int]:
    """Counts of the Hugging Face tokenizer's encodes: without offsets, and with them."""
    calls = {"encode": 0, "offsets": 0}
    encode, offsets = tok._encode, tok._tokenizer_offsets

    def counted_encode(*args, **kwargs):
        calls["encode"] += 1
        return encode(*args, **kwargs)

    def counted_offsets(*args, **kwargs):
        calls["offsets"] += 1
        return offsets(*args, **kwargs)

    tok._encode, tok._tokenizer_offsets = counted_encode, counted_offsets
    return calls


NOT_NFC = ["plain text", "Cafe\u0301 au lait", "cafe\u0301 東京 and more"]


def test_a_text_not_in_nfc_is_tokenized_once_by_a_tokenizer_without_a_normalizer(tmp_path):
    # Without a normalizer a byte-level BPE's tokens are the text's bytes, NFC or not: the
    # batched masks hold for a decomposed "é" and nothing is tokenized a second time.
    path = tmp_path / "bpe.json"
    path.write_text(trained_tokenizer_json())
    tok = HFTokenizer(str(path))
    assert tok.byte_lengths is not None and not tok.lengths_need_nfc
    ranges = [byte_ranges(t, [(0, 4), (6, 9)]) for t in NOT_NFC]
    ids = tok.encode_batch(NOT_NFC)
    assert all(m is not None for m in tiled_masks(ids, NOT_NFC, ranges, tok.byte_lengths, False))
    assert tiled_masks(ids, NOT_NFC, ranges, tok.byte_lengths, True)[1] is None
    calls = counted(tok)
    got = encode_masks(tok, NOT_NFC, ranges)
    assert calls == {"encode": 1, "offsets": 0}
    # the tokenizer's own character offsets, an independent account of the same tokens
    reference = [
        token_mask(offsets, r).tolist()
        for (_, offsets), r in zip(tok._tokenizer_offsets(NOT_NFC), ranges)
    ]
    assert [m.tolist() for _, m in got] == reference


def test_a_text_not_in_nfc_costs_an_nfc_tokenizer_one_more_encode_with_offsets():
    if not QWEN3.exists():
        pytest.fail(f"{QWEN3} is missing: run `make tokenizers` (`make test` does)")
    tok = HFTokenizer(str(QWEN3))
    assert tok.lengths_need_nfc
    ranges = [byte_ranges(t, [(0, 4), (6, 9)]) for t in NOT_NFC]
    calls = counted(tok)
    got = encode_masks(tok, NOT_NFC, ranges)
    assert calls == {"encode": 1, "offsets": 2}  # the batch, then each text not in NFC alone
    assert [m.tolist() for _, m in got] == per_text(tok, NOT_NFC, ranges)


def test_a_tokenizer_without_byte_lengths_masks_each_text_from_its_offsets(tmp_path):
    from tokenizers import Tokenizer, pre_tokenizers

    raw = Tokenizer.from_str(trained_tokenizer_json())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    raw.save(str(tmp_path / "prefix.json"))
    tok = HFTokenizer(str(tmp_path / "prefix.json"))
    assert tok.byte_lengths is None
    batch = texts()[:10]
    ranges = [byte_ranges(t, [(0, len(t) // 2)]) for t in batch]
    assert [m.tolist() for _, m in encode_masks(tok, batch, ranges)] == per_text(tok, batch, ranges)


def test_byte_ranges_of_non_ascii_text():
    text = "aé日🙂b"
    assert byte_ranges(text, [(0, 1), (1, 3), (3, 5), (5, 5)]) == (
        (0, 1),
        (1, 6),
        (6, 11),
        (11, 11),
    )
    assert byte_ranges("abc", [(1, 2)]) == ((1, 2),)


def test_a_token_of_no_bytes_counts_as_its_start_byte():
    table = np.array([1, 1, 0], dtype=np.int64)  # id 2 stands for no bytes
    ids = [np.array([0, 2, 1], dtype=np.int32), np.array([2, 0], dtype=np.int32)]
    offsets = [np.array([[0, 1], [1, 1], [1, 2]]), np.array([[0, 0], [0, 1]])]
    for ranges in ([[(1, 2)], [(0, 1)]], [[(0, 1)], [(1, 1)]], [[(1, 1)], []]):
        got = tiled_masks(ids, ["ab", "c"], ranges, table)
        want = [token_mask(o, r).tolist() for o, r in zip(offsets, ranges)]
        assert [m.tolist() for m in got] == want
