"""``tokenize``: text to token ids with a Hugging Face or the built-in byte tokenizer.

Adds BOS/EOS when asked. With ``max_length`` a longer document is split into children of at
most ``max_length`` tokens; child ``k`` gets cursor ``parent + (k,)`` and only the last child
closes the document. Payload out: ``{"input_ids": int32 array}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from ..records import SampleRecord, Span
from ..replay_cache import REPLAY_CACHE, ReplayCache
from ..tokenizer import Tokenizer, load_tokenizer
from .base import OpContext, Operator


class Tokenize(Operator):
    """Tokenizes ``payload["text"]`` into ``payload["input_ids"]``."""

    op_name = "tokenize"
    default_microbatch_size = 64

    def __init__(
        self,
        *,
        tokenizer: str = "byte",
        add_bos: bool = False,
        add_eos: bool = True,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
            raise ConfigError(f"tokenize: max_length must be an integer >= 1, got {max_length!r}")
        for name, value in (("add_bos", add_bos), ("add_eos", add_eos)):
            if not isinstance(value, bool):
                raise ConfigError(f"tokenize: {name} must be true or false, got {value!r}")
        self.tokenizer_spec = tokenizer
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.max_length = max_length
        self._tokenizer: Tokenizer | None = None
        self.tokenizer  # noqa: B018 - validate at construction (fails fast on a bad path)

    @property
    def tokenizer(self) -> Tokenizer:
        """The loaded tokenizer (loaded lazily after unpickling in a worker)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_spec)
        return self._tokenizer

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tokenizer"] = None
        state.pop("_replay_cache", None)  # workers get theirs from setup(ctx)
        return state

    def params(self) -> dict[str, Any]:
        return {
            "tokenizer": self.tokenizer.identity,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
            "max_length": self.max_length,
        }

    def describe(self) -> str:
        return (
            f"tokenize(tokenizer={self.tokenizer.name!r}, add_bos={self.add_bos}, "
            f"add_eos={self.add_eos}, max_length={self.max_length})"
        )

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._replay_cache = ctx.extras.get(REPLAY_CACHE)

    def _encode(self, elems: list[Any]) -> list[np.ndarray]:
        """Token ids per record, BOS/EOS included: from the replay cache where a replayed
        chunk has them, otherwise encoded (and written to the cache when there is one)."""
        tok = self.tokenizer
        prefix = (tok.bos_id,) if self.add_bos else ()
        suffix = (tok.eos_id,) if self.add_eos else ()
        cache: ReplayCache | None = getattr(self, "_replay_cache", None)
        if cache is None:
            return tok.encode_batch(
                [rec.payload["text"] for rec in elems], prefix=prefix, suffix=suffix
            )
        op_index = self.ctx.op_index
        found: list[np.ndarray | None] = (
            cache.lookup(op_index, elems) if cache.replay_ends else [None] * len(elems)
        )
        missing = [i for i, ids in enumerate(found) if ids is None]
        if missing:
            encoded = tok.encode_batch(
                [elems[i].payload["text"] for i in missing], prefix=prefix, suffix=suffix
            )
            cache.store(op_index, [elems[i] for i in missing], encoded)
            for i, ids in zip(missing, encoded):
                found[i] = ids
        return found  # type: ignore[return-value]

    def process_many(self, elems: list[Any]) -> list[Any]:
        ids_list = self._encode(elems)
        max_length = self.max_length
        out: list[Any] = []
        for rec, ids in zip(elems, ids_list):
            meta = rec.meta
            doc = meta.doc
            n = len(ids)
            if max_length is None or n <= max_length:
                out.append(SampleRecord({"input_ids": ids}, meta.with_spans((Span(doc, 0, n),))))
                continue
            pieces = range(0, n, max_length)
            last = len(pieces) - 1
            for k, start in enumerate(pieces):
                part = ids[start : start + max_length]
                child = meta.child(
                    k, spans=(Span(doc, start, len(part)),), closes=meta.closes if k == last else ()
                )
                out.append(SampleRecord({"input_ids": part}, child))
        return out
