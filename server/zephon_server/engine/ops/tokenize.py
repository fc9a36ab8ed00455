"""``tokenize``: text to token ids with a Hugging Face or the built-in byte tokenizer.

Adds BOS/EOS when asked. With ``max_length`` a longer document is split into children of at
most ``max_length`` tokens; child ``k`` gets cursor ``parent + (k,)`` and only the last child
closes the document. Payload out: ``{"input_ids": int32 array}``.

A micro-batch is encoded with one batched call. If that call raises, the records are encoded
one by one to find the one(s) at fault: each follows its dataset's ``on_error`` (tombstone
``tokenize_error`` or a :class:`DataError` naming the file and line), and every other record
of the micro-batch gets exactly the ids the batched call would have given it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from ..records import SampleRecord, Span
from ..replay_cache import REPLAY_CACHE, ReplayCache
from ..tokenizer import Tokenizer, load_tokenizer
from .bad_record import on_bad_record, tokenizer_problem
from .base import OpContext, Operator, OpTraits

#: Token ids per record, and the exception of each record the tokenizer failed on (by index).
Encoded = tuple[list[np.ndarray], dict[int, Exception]]


class Tokenize(Operator):
    """Tokenizes ``payload["text"]`` into ``payload["input_ids"]``."""

    op_name = "tokenize"
    default_microbatch_size = 64

    def traits(self) -> OpTraits:
        # Records leave in input order; count-based grouping: fusable with its neighbours.
        return OpTraits(preserves_cursor_order=True, fusable=True)

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
        tok = self.tokenizer  # validated at construction (fails fast on a bad path)
        for flag, kind, tid in (("add_bos", "BOS", tok.bos_id), ("add_eos", "EOS", tok.eos_id)):
            if getattr(self, flag) and tid < 0:
                raise ConfigError(
                    f"tokenize: {flag}: the tokenizer {tok.name!r} has no {kind} token (its "
                    "tokenizer_config.json names none, and none of the usual special tokens "
                    f"is in it); set {flag}: false"
                )

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
            # the ids written (from tokenizer_config.json, which the tokenizer's identity
            # does not cover): another EOS or pad is other data
            "special_ids": [self.tokenizer.bos_id, self.tokenizer.eos_id, self.tokenizer.pad_id],
        }

    def describe(self) -> str:
        return (
            f"tokenize(tokenizer={self.tokenizer.name!r}, add_bos={self.add_bos}, "
            f"add_eos={self.add_eos}, max_length={self.max_length})"
        )

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._replay_cache = ctx.extras.get(REPLAY_CACHE)

    def _encode_texts(self, elems: list[Any]) -> Encoded:
        """Token ids, BOS/EOS included, of every record: one batched call, or, if that raises,
        one call per record so the failing records are found and the others still encoded."""
        tok = self.tokenizer
        prefix = (tok.bos_id,) if self.add_bos else ()
        suffix = (tok.eos_id,) if self.add_eos else ()
        try:
            return tok.encode_batch(
                [rec.payload["text"] for rec in elems], prefix=prefix, suffix=suffix
            ), {}
        except Exception:  # find the record(s) at fault below, one by one
            pass
        ids_list: list[np.ndarray] = []
        failed: dict[int, Exception] = {}
        for i, rec in enumerate(elems):
            try:
                (ids,) = tok.encode_batch([rec.payload["text"]], prefix=prefix, suffix=suffix)
            except Exception as exc:  # one record's failure is that record's problem
                failed[i] = exc
                ids = np.zeros(0, dtype=np.int32)
            ids_list.append(ids)
        return ids_list, failed

    def _encode(self, elems: list[Any]) -> Encoded:
        """Token ids per record: from the replay cache where a replayed chunk has them,
        otherwise encoded (and written to the cache when there is one)."""
        cache: ReplayCache | None = getattr(self, "_replay_cache", None)
        if cache is None:
            return self._encode_texts(elems)
        op_index = self.ctx.op_index
        found: list[np.ndarray | None] = (
            cache.lookup(op_index, elems) if cache.replay_ends else [None] * len(elems)
        )
        missing = [i for i, ids in enumerate(found) if ids is None]
        failed: dict[int, Exception] = {}
        if missing:
            encoded, bad = self._encode_texts([elems[i] for i in missing])
            failed = {missing[j]: exc for j, exc in bad.items()}
            good = [j for j in range(len(missing)) if j not in bad]
            cache.store(op_index, [elems[missing[j]] for j in good], [encoded[j] for j in good])
            for i, ids in zip(missing, encoded):
                found[i] = ids
        return found, failed  # type: ignore[return-value]

    def process_many(self, elems: list[Any]) -> list[Any]:
        ids_list, failed = self._encode(elems)
        if not failed:
            return self._records(elems, ids_list)
        out: list[Any] = []
        for i, rec in enumerate(elems):
            if i in failed:
                out.append(self._failed(rec, failed[i]))
            else:
                out.extend(self._records([rec], [ids_list[i]]))
        return out

    def _failed(self, rec: SampleRecord, exc: Exception) -> SampleRecord:
        """The tombstone (``on_error: skip``) for a record the tokenizer failed on."""
        datasets = getattr(getattr(self, "ctx", None), "datasets", ())
        problem = tokenizer_problem(rec.payload.get("text"), exc)
        if not datasets or rec.meta.doc is None:
            raise DataError(f"tokenize: {problem} (record {rec.meta.cursor})") from exc
        try:
            return on_bad_record(rec, datasets[rec.meta.dataset_id], "tokenize_error", problem)
        except DataError as err:
            raise err from exc

    def _records(self, elems: list[Any], ids_list: list[np.ndarray]) -> list[Any]:
        """Records carrying the ids, split into ``max_length`` pieces when asked."""
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
