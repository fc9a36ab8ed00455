"""Plain-text datasets in a chat pipeline (``render_chat.text_datasets``).

SFT runs mix some pretraining text into the conversations. The datasets named in
``text_datasets`` hold plain text, read by the dataset's ``text_field`` exactly as
``decode_text`` reads it, and tokenized as ``tokenize`` tokenizes it: the BOS before it when
``text_bos`` (``tokenize``'s ``add_bos``, default off), the EOS after it when ``text_eos``
(``add_eos``, default on), split into pieces of ``max_length`` tokens rather than cut (nothing
of a text is lost), and trained whole. So a text document has the ids a pretraining pipeline
gives it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import ConfigError
from .json_line import loads_line
from .records import SampleRecord, Span
from .token_masks import MASK_DTYPE

log = logging.getLogger(__name__)

#: The fix a bad text record's message names (its reason is ``decode_text``'s ``malformed``).
EMPTY_FIX = "remove empty texts from the dataset, or set render_chat.text_eos: true"


class TextDatasets:
    """The ``text_datasets``, ``text_bos`` and ``text_eos`` options of ``render_chat``."""

    def __init__(self, names: Any, bos: Any, eos: Any) -> None:
        if names is not None and (
            not isinstance(names, list) or not all(isinstance(n, str) and n for n in names)
        ):
            raise ConfigError(
                f"render_chat: text_datasets must be a list of dataset names, got {names!r} "
                "(e.g. text_datasets: [web])"
            )
        for flag, value in (("text_bos", bos), ("text_eos", eos)):
            if not isinstance(value, bool):
                raise ConfigError(f"render_chat: {flag} must be true or false, got {value!r}")
        self.names: tuple[str, ...] = tuple(sorted(set(names or ())))
        self.bos = bos
        self.eos = eos
        self.ids: frozenset[int] = frozenset()  # their dataset ids (:meth:`resolve`)
        self._warned_chat = False

    def __bool__(self) -> bool:
        return bool(self.names)

    def check_tokenizer(self, tokenizer: Any) -> None:
        """:class:`ConfigError` when ``text_bos``/``text_eos`` ask for a token the tokenizer
        lacks (as ``tokenize`` refuses ``add_bos``/``add_eos``)."""
        if not self.names:
            return
        for flag, kind, wanted, tid in (
            ("text_bos", "BOS", self.bos, tokenizer.bos_id),
            ("text_eos", "EOS", self.eos, tokenizer.eos_id),
        ):
            if wanted and tid < 0:
                raise ConfigError(
                    f"render_chat: {flag}: the tokenizer {tokenizer.name!r} has no {kind} token "
                    "(its tokenizer_config.json names none, and none of the usual special "
                    f"tokens is in it); set {flag}: false"
                )

    def check_names(self, names: Sequence[str]) -> None:
        """:class:`ConfigError` for a name that is not one of the pipeline's ``names``."""
        unknown = [name for name in self.names if name not in names]
        if unknown:
            raise ConfigError(
                f"render_chat: text_datasets names unknown dataset {unknown[0]!r}; the "
                f"pipeline's datasets are {list(names)}"
            )

    def resolve(self, names: Sequence[str]) -> None:
        """Set :attr:`ids` from the pipeline's dataset ``names`` (checked)."""
        self.check_names(names)
        self.ids = frozenset(list(names).index(name) for name in self.names)

    def params(self) -> dict[str, Any]:
        """For the fingerprint: nothing when unset (chat pipelines keep their fingerprint)."""
        if not self.names:
            return {}
        return {"text": {"datasets": list(self.names), "bos": self.bos, "eos": self.eos}}

    def describe(self) -> str:
        if not self.names:
            return ""
        return f", text_datasets={list(self.names)}, text_bos={self.bos}, text_eos={self.eos}"

    def chat_hint(self, payload: dict[str, Any], messages_field: str, dataset: str) -> str:
        """For a text record that has no text: a hint when it is a conversation (a chat
        dataset named in ``text_datasets`` by mistake), else nothing."""
        if _conversation(payload, messages_field):
            return (
                f"; dataset {dataset!r} is in render_chat.text_datasets but its records are "
                f"conversations ({messages_field!r}): remove it from text_datasets"
            )
        return ""

    def warn_if_chat(self, rec: SampleRecord, messages_field: str, where: str) -> None:
        """Log once per worker that a text record is also a conversation: its text field is
        trained whole and its messages are not read (legitimate for a dataset that keeps each
        conversation rendered beside its messages; a mistake for a chat dataset)."""
        if self._warned_chat or not _conversation(rec.payload, messages_field):
            return
        self._warned_chat = True
        log.warning(
            "render_chat: %s is in a dataset of render_chat.text_datasets but is also a "
            "conversation (it has %r): its text is trained whole and its messages are not "
            "read. Remove the dataset from text_datasets to train the conversations. Logged "
            "once per worker.",
            where,
            messages_field,
        )

    @staticmethod
    def pieces(rec: Any, payload: dict[str, Any], max_length: int | None) -> list[Any]:
        """The records of a text's tokens: one, or pieces of ``max_length`` tokens as
        ``tokenize`` makes them (the last one closes the document)."""
        ids, mask = payload["input_ids"], payload["loss_mask"]
        meta, doc, n = rec.meta, rec.meta.doc, len(ids)
        if max_length is None or n <= max_length:
            return [SampleRecord(payload, meta.with_spans((Span(doc, 0, n),)))]
        starts = range(0, n, max_length)
        last = len(starts) - 1
        out = []
        for k, start in enumerate(starts):
            end = start + max_length
            part = {"input_ids": ids[start:end], "loss_mask": mask[start:end]}
            child = meta.child(
                k,
                spans=(Span(doc, start, len(part["input_ids"])),),
                closes=meta.closes if k == last else (),
            )
            out.append(SampleRecord(part, child))
        return out


def _conversation(payload: dict[str, Any], messages_field: str) -> bool:
    """Whether a fetched record is a JSON object with ``messages_field`` (a JSONL line, or a
    Parquet text value holding JSON): looked for in its bytes first, parsed only then."""
    value = payload.get("raw", payload.get("text"))
    if isinstance(value, str):
        if not value[:64].lstrip().startswith("{") or f'"{messages_field}"' not in value:
            return False
    elif isinstance(value, bytes | bytearray | memoryview):
        if f'"{messages_field}"'.encode() not in bytes(value):
            return False
    else:
        return False
    try:
        obj = loads_line(value if isinstance(value, str) else bytes(value))
    except Exception:  # not JSON: plain text after all
        return False
    return isinstance(obj, dict) and messages_field in obj


def trained_prefix(prefix: Sequence[int], kind: str) -> np.ndarray:
    """The mask of ids put before a text: trained for a plain text (trained whole), not for
    a prompt's BOS."""
    return np.full(len(prefix), 1 if kind == "text" else 0, dtype=MASK_DTYPE)
