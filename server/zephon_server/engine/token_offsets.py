"""Token offsets: where each token of a text starts and ends, in UTF-8 bytes.

``render_chat`` maps trained character ranges to tokens through offsets. Hugging Face
``tokenizers`` computes character offsets on request, which costs noticeably more than
encoding without them. For the common byte-level BPE tokenizers (GPT-2, Llama 3, Qwen, ...)
offsets follow from the ids alone: with no normalizer (or NFC on a text already in NFC) and
no prefix space added, the tokens
of a text are its UTF-8 bytes cut into pieces, in order, and a vocabulary token of the
byte-level alphabet stands for one byte per character. :func:`byte_length_table` recognises
such a tokenizer (from its ``tokenizer.json``) and gives each id's length in bytes; offsets
are then a cumulative sum. :func:`offsets_from_lengths` checks per text that the lengths add
up to the text's byte length (an added token that strips whitespace, for example, breaks
that) and returns None otherwise, and the caller asks the tokenizer for offsets instead.
:func:`char_to_byte_offsets` converts the tokenizer's character offsets to bytes.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


def _byte_level_pretokenizer(spec: Any) -> bool:
    """A ByteLevel pre-tokenizer without prefix space, alone or after Split steps."""
    if not isinstance(spec, dict):
        return False
    if spec.get("type") == "Sequence":
        steps = spec.get("pretokenizers") or []
        return (
            bool(steps)
            and all(s.get("type") == "Split" or _byte_level_pretokenizer(s) for s in steps)
            and any(s.get("type") == "ByteLevel" for s in steps)
        )
    return spec.get("type") == "ByteLevel" and not spec.get("add_prefix_space", False)


#: The one normalizer offsets from lengths allow: it changes no text already in NFC, which
#: :func:`offsets_from_lengths` checks per text (Qwen2/3 tokenizers have it).
NFC = {"type": "NFC"}


def tokenizer_spec(tokenizer_json: str) -> dict[str, Any] | None:
    """A ``tokenizer.json`` parsed, or None when it is not a JSON object."""
    try:
        spec = json.loads(tokenizer_json)
    except ValueError:
        return None
    return spec if isinstance(spec, dict) else None


def normalizes_nfc(spec: dict[str, Any] | None) -> bool:
    """Whether the tokenizer normalises to NFC: its tokens then stand for a text's bytes only
    when the text is already in NFC. Without a normalizer they always do."""
    return spec is None or spec.get("normalizer") == NFC


def byte_length_table(spec: dict[str, Any] | None, tokenizer: Any) -> np.ndarray | None:
    """Bytes per token id of a byte-level BPE tokenizer (``spec``: its parsed
    ``tokenizer.json``), or None when offsets cannot be derived from ids (another model or
    pre-tokenizer, a normalizer other than NFC, a non-byte vocabulary)."""
    if spec is None:
        return None
    model = spec.get("model") or {}
    if spec.get("normalizer") not in (None, NFC) or model.get("type") != "BPE":
        return None
    if not _byte_level_pretokenizer(spec.get("pre_tokenizer")):
        return None
    from tokenizers import pre_tokenizers

    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    added = {int(t["id"]): str(t["content"]) for t in spec.get("added_tokens") or []}
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    table = np.zeros(size, dtype=np.int64)
    for token, tid in tokenizer.get_vocab(with_added_tokens=True).items():
        if tid in added:
            table[tid] = len(added[tid].encode("utf-8"))
        elif set(token) <= alphabet:
            table[tid] = len(token)
        else:
            logger.debug("token %r is not byte-level: offsets come from the tokenizer", token)
            return None
    return table


def tiled_size(text: str, nfc: bool = True) -> int:
    """The bytes ``text``'s tokens add up to when they tile it: its UTF-8 length, or -1 (no
    tokens add up to it) for a text the tokenizer's NFC normalizer (``nfc``) would change,
    whose tokens then do not stand for its bytes."""
    if text.isascii():
        return len(text)
    if nfc and not unicodedata.is_normalized("NFC", text):
        return -1
    return len(text.encode("utf-8", "surrogatepass"))


def offsets_from_lengths(
    ids: np.ndarray, table: np.ndarray, text: str, nfc: bool = True
) -> np.ndarray | None:
    """Byte offsets ``[n, 2]`` of ``ids`` from their lengths, or None when the lengths do not
    add up to :func:`tiled_size` (the tokens then do not tile the text)."""
    ends = np.cumsum(table[ids])
    if (int(ends[-1]) if len(ends) else 0) != tiled_size(text, nfc):
        return None
    out = np.empty((len(ids), 2), dtype=np.int64)
    out[:, 1] = ends
    out[:, 0] = ends - table[ids]
    return out


def char_to_byte_offsets(text: str, offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """Character offsets ``[(start, end), ...]`` of ``text`` as UTF-8 byte offsets."""
    chars = np.asarray(offsets, dtype=np.int64).reshape(len(offsets), 2)
    if text.isascii():
        return chars
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    widths = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)
    starts = np.concatenate([[0], np.cumsum(widths)])  # byte position of each character
    return starts[chars]


def byte_ranges(text: str, ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Character ranges of ``text`` as UTF-8 byte ranges (the text encoded once, piece by
    piece between the range ends)."""
    if text.isascii():
        return tuple(ranges)
    at: dict[int, int] = {}
    done = size = 0
    for cut in sorted({i for pair in ranges for i in pair}):
        size += len(text[done:cut].encode("utf-8", "surrogatepass"))
        at[cut] = size
        done = cut
    return tuple((at[lo], at[hi]) for lo, hi in ranges)
