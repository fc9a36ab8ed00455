"""Tokenizers: the built-in byte-level tokenizer and Hugging Face ``tokenizers`` models.

``load_tokenizer("byte")`` gives the byte-level tokenizer (UTF-8 bytes are ids 0-255, then
BOS, EOS and PAD), which needs no file. A path to a ``tokenizer.json`` loads a Hugging Face
tokenizer; any other string is treated as a hub id (only when the machine can reach the hub).
Every tokenizer has an ``identity`` string that enters the pipeline fingerprint: the byte
tokenizer's name, or the sha256 of the ``tokenizer.json`` contents.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from .errors import ConfigError
from .token_offsets import (
    byte_length_table,
    char_to_byte_offsets,
    normalizes_nfc,
    offsets_from_lengths,
    tiled_size,
    tokenizer_spec,
)

log = logging.getLogger(__name__)
_ID_DTYPE = np.int32


class Tokenizer(Protocol):
    """What operators need from a tokenizer."""

    name: str
    identity: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    def encode_batch(
        self, texts: Sequence[str], *, prefix: Sequence[int] = (), suffix: Sequence[int] = ()
    ) -> list[np.ndarray]:
        """Token ids (int32) for each text, between ``prefix`` and ``suffix`` (e.g. BOS, EOS);
        the tokenizer adds no special tokens of its own."""
        ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text for ids; special tokens are dropped."""
        ...

    def encode_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Token ids (int32) and UTF-8 byte offsets (int64 ``[n, 2]``: start, end) of each
        text, special tokens written in the text included (used to map text to tokens); the
        tokenizer adds no special tokens of its own."""
        ...

    #: Bytes per id when a text's tokens are its UTF-8 bytes cut in order (offsets then
    #: follow from the ids, see :mod:`.token_offsets`); None for other tokenizers.
    byte_lengths: np.ndarray | None
    #: Whether ``byte_lengths`` hold only for texts already in NFC (an NFC normalizer).
    lengths_need_nfc: bool


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; BOS=256, EOS=257, PAD=258. Needs no file and no training."""

    name = "byte"
    identity = "byte-v1"
    vocab_size = 259
    bos_id = 256
    eos_id = 257
    pad_id = 258
    byte_lengths: np.ndarray | None = np.ones(vocab_size, dtype=np.int64)  # tokens tile
    lengths_need_nfc = False  # the bytes of any text

    def encode_batch(
        self, texts: Sequence[str], *, prefix: Sequence[int] = (), suffix: Sequence[int] = ()
    ) -> list[np.ndarray]:
        head, tail = len(prefix), len(suffix)
        out = []
        for t in texts:
            data = np.frombuffer(t.encode("utf-8", "surrogatepass"), dtype=np.uint8)
            ids = np.empty(head + len(data) + tail, dtype=_ID_DTYPE)
            ids[:head] = prefix
            ids[head : head + len(data)] = data
            ids[head + len(data) :] = suffix
            out.append(ids)
        return out

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        data = bytes(int(i) for i in np.asarray(ids).ravel() if 0 <= int(i) < 256)
        return data.decode("utf-8", "replace")

    def encode_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for t in texts:
            data = t.encode("utf-8", "surrogatepass")
            starts = np.arange(len(data), dtype=np.int64)
            offsets = np.stack([starts, starts + 1], axis=1).reshape(len(data), 2)
            out.append((np.frombuffer(data, dtype=np.uint8).astype(_ID_DTYPE), offsets))
        return out


class HFTokenizer:
    """A Hugging Face ``tokenizers`` model loaded from a tokenizer.json file or a hub id."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
    ) -> None:
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError as exc:  # pragma: no cover - server extra missing
            raise ConfigError(
                "tokenizer: the 'tokenizers' package is missing; install zephon-service[server]"
            ) from exc
        path = Path(source)
        if path.suffix == ".json" or path.exists():
            if path.is_dir():
                inside = path / "tokenizer.json"
                found = f": give {str(inside)!r}" if inside.is_file() else ""
                raise ConfigError(
                    f"tokenizer: {source!r} ({path.resolve()}) is a directory; the tokenizer "
                    f"is the tokenizer.json file in it{found}"
                )
            if not path.is_file():
                raise ConfigError(
                    f"tokenizer: file {source!r} ({path.resolve()}) does not exist (give a "
                    "path to a tokenizer.json, 'byte', or a hub id)"
                )
            raw = path.read_bytes()
            self._json = raw.decode("utf-8")
            self._tok = _HFTokenizer.from_str(self._json)
            self.identity = "sha256:" + hashlib.sha256(raw).hexdigest()
            self.name = str(path)
        else:
            try:
                self._tok = _HFTokenizer.from_pretrained(source)
                self._json = self._tok.to_str()
            except Exception as exc:
                raise ConfigError(
                    f"tokenizer: cannot load {source!r} from the hub ({exc}); give a path to a "
                    "tokenizer.json or use 'byte'"
                ) from exc
            self.identity = "sha256:" + hashlib.sha256(self._json.encode()).hexdigest()
            self.name = source
        self._tok.no_padding()
        self._tok.no_truncation()
        # encode_batch_fast (tokenizers >= 0.20) skips character offsets, which ids never need:
        # the same ids for less work (the measured gain is in docs/decisions.md).
        self._encode = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        spec = tokenizer_spec(self._json)
        self.byte_lengths: np.ndarray | None = byte_length_table(spec, self._tok)
        self.lengths_need_nfc = normalizes_nfc(spec)
        config = _config_tokens(path) if self.name == str(path) else {}
        self.bos_id = self._special(
            bos_token, config, "bos_token", ("<s>", "<|begin_of_text|>", "[BOS]", "<bos>")
        )
        self.eos_id = self._special(
            eos_token, config, "eos_token", ("</s>", "<|endoftext|>", "[EOS]", "<eos>")
        )
        pad = self._special(pad_token, config, "pad_token", ("<pad>", "[PAD]", "<|pad|>"))
        self.pad_id = pad if pad >= 0 else (self.eos_id if self.eos_id >= 0 else 0)

    def _special(
        self,
        explicit: str | None,
        config: dict[str, str | None],
        key: str,
        candidates: tuple[str, ...],
    ) -> int:
        """The id of ``explicit``, else of the token the tokenizer_config.json beside the file
        names under ``key`` (as Hugging Face reads it; its null means none), else of the first
        of ``candidates`` that is one of the tokenizer's *special* tokens (Qwen's vocabulary
        has ``</s>`` as an ordinary piece); -1 for none."""
        if explicit:
            tid = self._tok.token_to_id(explicit)
            if tid is None:
                raise ConfigError(
                    f"tokenizer {self.name!r}: special token {explicit!r} not in vocab"
                )
            return int(tid)
        if key in config:  # null in the config: the model has none
            name = config[key]
            tid = self._tok.token_to_id(name) if name else None
            if name and tid is None:
                log.warning(
                    "tokenizer %s: tokenizer_config.json names %s %r, which is not in its "
                    "vocabulary; taken as none",
                    self.name,
                    key,
                    name,
                )
            return -1 if tid is None else int(tid)
        specials = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        for token in candidates:
            tid = self._tok.token_to_id(token) if token in specials else None
            if tid is not None:
                return int(tid)
        return -1

    def added_prefix(self) -> tuple[int, ...]:
        """The ids the tokenizer's post-processor writes before a text when special tokens
        are added (Llama 3's ``<|begin_of_text|>``; none for most): what Hugging Face's
        ``tokenizer(text)`` starts with."""
        plain = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        at = len(full) - len(plain)
        for start in range(at + 1):
            if full[start : start + len(plain)] == plain:
                return tuple(int(i) for i in full[:start])
        return ()

    def encode_batch(
        self, texts: Sequence[str], *, prefix: Sequence[int] = (), suffix: Sequence[int] = ()
    ) -> list[np.ndarray]:
        encodings = self._encode(list(texts), add_special_tokens=False)
        if not prefix and not suffix:
            return [np.asarray(e.ids, dtype=_ID_DTYPE) for e in encodings]
        head, tail = list(prefix), list(suffix)
        out = []
        for e in encodings:
            ids = e.ids  # a new list on every access
            ids.extend(tail)
            if head:
                ids[:0] = head
            out.append(np.asarray(ids, dtype=_ID_DTYPE))
        return out

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode([int(i) for i in np.asarray(ids).ravel()]))

    def encode_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Offsets from token byte lengths for byte-level BPE tokenizers (no offsets to
        compute, see :mod:`.token_offsets`), else from the tokenizer's character offsets."""
        lengths, nfc = self.byte_lengths, self.lengths_need_nfc
        if lengths is None:
            return self._tokenizer_offsets(texts)
        tiles = [tiled_size(text, nfc) >= 0 for text in texts]  # else: straight to offsets
        tiling = [t for t, ok in zip(texts, tiles) if ok]
        encoded = iter(self._encode(tiling, add_special_tokens=False) if tiling else ())
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for text, ok in zip(texts, tiles):
            if ok:
                ids = np.asarray(next(encoded).ids, dtype=_ID_DTYPE)
                offsets = offsets_from_lengths(ids, lengths, text, nfc)
                if offsets is not None:
                    out.append((ids, offsets))
                    continue
            out.append(self._tokenizer_offsets([text])[0])
        return out

    def _tokenizer_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [
            (np.asarray(e.ids, dtype=_ID_DTYPE), char_to_byte_offsets(text, e.offsets))
            for text, e in zip(texts, encodings)
        ]

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` (a special or ordinary token string), None when unknown."""
        tid = self._tok.token_to_id(token)
        return None if tid is None else int(tid)


_CACHE: dict[str, Tokenizer] = {}
_CACHE_LOCK = threading.Lock()


def _config_tokens(path: Path) -> dict[str, str | None]:
    """``bos_token``, ``eos_token`` and ``pad_token`` of the ``tokenizer_config.json`` beside a
    tokenizer.json (strings, or the ``content`` of an AddedToken dict; None where the config
    says null); empty without one."""
    config = path.with_name("tokenizer_config.json")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tokenizer: cannot read {config}: {exc}") from exc
    found: dict[str, str | None] = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        if not isinstance(data, dict) or key not in data:
            continue
        value = data[key]
        if isinstance(value, dict):
            value = value.get("content")
        found[key] = value if isinstance(value, str) and value else None
    return found


def load_tokenizer(spec: str = "byte") -> Tokenizer:
    """The tokenizer named by ``spec`` ("byte", a tokenizer.json path or a hub id); cached."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError(
            f"tokenizer: expected 'byte', a tokenizer.json path or a hub id, got {spec!r}"
        )
    key = os.path.abspath(spec) if spec != "byte" and os.path.exists(spec) else spec
    with _CACHE_LOCK:
        tok = _CACHE.get(key)
        if tok is None:
            tok = ByteTokenizer() if spec == "byte" else HFTokenizer(spec)
            _CACHE[key] = tok
        return tok


def train_bpe_tokenizer(texts: Sequence[str], out_path: str | Path, vocab_size: int = 4096) -> Path:
    """Train a byte-level BPE tokenizer on ``texts`` and save it as tokenizer.json.

    Stands in for a downloaded model in tests and benchmarks (no hub access needed).
    """
    from tokenizers import Tokenizer as _HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out
