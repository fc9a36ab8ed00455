"""``render_chat``: chat and prompt/completion records to ``input_ids`` and ``loss_mask``.

It replaces ``decode_text`` + ``tokenize`` for post-training data and reads the fetched
record itself: a JSONL line (or a Parquet value holding JSON, or a list of messages) with

* a ``messages`` field (name configurable): ``[{role, content}, ...]``, rendered with the
  chat template (:mod:`..chat_template`); which characters are trained comes from rendering
  the conversation turn by turn (:mod:`..chat_layout`), never from special-token ids; a
  trained turn's reasoning (``reasoning_content``, name configurable) is trained too where the
  template writes it, from the end of the generation prompt (``train_reasoning: false``: only
  contents and ends of turn);
* or ``prompt`` and ``completion`` strings (names configurable): the text ``prompt +
  completion``, trained on the completion, then the EOS token (trained) when
  ``completion_eos`` is on and the tokenizer has one;
* messages in another convention (ShareGPT's ``{"from": "human", "value": ...}``) with
  ``role_key``, ``content_key`` and ``role_names`` (:mod:`..chat_keys`);
* or ``prompt`` and ``completion`` lists of messages (TRL's conversational prompt/completion):
  one conversation, ``prompt + completion``, rendered as above, whose prompt messages are
  never trained (``train_on`` chooses among the completion's);
* or, for the datasets named in ``text_datasets``, plain text (the dataset's ``text_field``),
  tokenized as ``decode_text`` + ``tokenize`` would, split rather than cut by ``max_length``,
  and trained whole: pretraining text mixed into a chat pipeline (:mod:`..chat_text`).

The rendered text is tokenized once; a token is trained (mask 1) when its UTF-8 bytes overlap
a trained range (:mod:`..token_masks`, a micro-batch at once). ``max_length`` keeps the
first ``max_length`` tokens. Payload out: ``{"input_ids": int32, "loss_mask": uint8}``, same
length; meta as ``tokenize`` (one span over the document's tokens; the record closes its
document).

Bad records follow the dataset's ``on_error`` (tombstone reasons in brackets): JSON that does
not parse (``malformed``); a missing or malformed messages field or a template that fails or
cannot be attributed (``chat_error``); nothing to learn, all zeros (``mask_empty``); nothing
masked, all ones (``mask_full``); a ``max_length`` cut that removes every trained token
(``mask_truncated``); a tokenizer failure (``tokenize_error``).
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ..chat_keys import Keys, renamed
from ..chat_layout import TRAIN_ON, ChatError, check_messages, check_tools, layout_chat
from ..chat_skeleton import Skeletons
from ..chat_slots import TOOL_FIELDS
from ..chat_template import (
    RESERVED_VARIABLES,
    ChatTemplate,
    ChatTemplateError,
    TemplateSource,
    find_template,
)
from ..chat_text import EMPTY_FIX, TextDatasets, trained_prefix
from ..errors import ConfigError, DataError
from ..json_line import loads_line
from ..records import SampleRecord, Span
from ..token_masks import MASK_DTYPE, encode_masks
from ..token_offsets import byte_ranges
from ..tokenizer import Tokenizer, load_tokenizer
from .bad_record import describe_exception, location, on_bad_record, tokenizer_problem
from .base import OpContext, Operator, OpTraits
from .decode import _parse_problem, _text_of

log = logging.getLogger(__name__)

#: Tombstone reasons of this operator (all counted as skipped records).
CHAT_ERROR, MASK_EMPTY, MASK_FULL, MASK_TRUNCATED = (
    "chat_error",
    "mask_empty",
    "mask_full",
    "mask_truncated",
)
FIXES = {
    "malformed": "fix the record",
    CHAT_ERROR: "fix the record or the chat template",
    MASK_EMPTY: "give the record a turn to train on (an assistant turn or a completion) or "
    "change render_chat.train_on",
    MASK_FULL: "check that the chat template writes role headers (for a prompt/completion "
    "record: give it a prompt)",
    MASK_TRUNCATED: "raise render_chat.max_length or shorten the conversation",
    "tokenize_error": "fix the record",
}


#: Raised when the same record and options render or train differently than before, so that
#: the fingerprint refuses a checkpoint taken by the earlier rule. 2: an assistant turn whose
#: empty content the template leaves out (tool calls under Qwen2.5's or Llama 3.2's template)
#: is trained from the generation prompt, where it was a chat_error. 3: so is a turn whose
#: reasoning the template strips to nothing (a reasoning of newlines under Qwen3's). 4: a
#: conversational prompt/completion record (two lists of messages) renders, where it was a
#: chat_error. 5: an untrained message whose content the template writes nothing of (a role
#: it does not know) is a chat_error, where it was left out of the tokens. 6: so are tool calls
#: the template writes nothing of, and tool definitions it never reads. 7: a message's null
#: field (``"tool_calls": null``) is left out, as Hugging Face leaves it out. 8: under
#: ``train_on: all`` a turn that is not the model's trains its content and the end of turn it
#: ends with, not the template text between them (Qwen's ``</tool_response>``), and its content
#: may be written JSON-escaped (Llama 3's tool answers), where that was a chat_error. 9: what
#: a template writes once after the last turn (Phi-3's EOS when no generation is asked for) is
#: part of no turn's end of turn, where it was trained with the last turn and an earlier turn's
#: end of turn reached into the next turn's header.
#: 10: a message's reasoning that the template never names (Qwen2.5's, Llama 3.2's templates
#: write no reasoning) is a chat_error, where it was left out of the tokens with a log line.
#: 11: a prompt/completion record starts with what the tokenizer's post-processor writes
#: before a text (Llama 3's BOS), as ``tokenizer(prompt + completion)`` does.
LAYOUT_VERSION = 11


#: What a record with nothing to learn lacks, by kind (:attr:`Rendered.kind`).
_EMPTY = {
    "chat": "no assistant turn",
    "prompt/completion": "an empty completion",
    "text": "an empty text",
}


class RecordProblem(Exception):
    """One record's problem: a tombstone reason, the text for the error message, and the fix
    it names (default: the reason's, :data:`FIXES`)."""

    def __init__(self, reason: str, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.reason = reason
        self.problem = problem
        self.fix = fix or FIXES[reason]


@dataclass(frozen=True)
class Rendered:
    """A record's text, its trained character ranges, and whether EOS is appended (trained)."""

    text: str
    trained: tuple[tuple[int, int], ...]
    append_eos: bool
    kind: str
    unwritten_reasoning: int | None = None  # a trained message whose reasoning is not written
    #: Ids put before the text (a prompt/completion record's BOS, as the tokenizer's
    #: post-processor writes it for ``tokenizer(prompt + completion)``, untrained; a plain
    #: text's ``text_bos``, trained).
    prefix: tuple[int, ...] = ()


def _record_object(payload: dict[str, Any]) -> Any:
    """The record as Python data: a JSONL line parsed, a Parquet value parsed if it is text."""
    if "raw" in payload:
        value: Any = payload["raw"]
    else:
        value = payload.get("text")
        if not isinstance(value, str | bytes):
            return value  # e.g. a Parquet list column: the messages themselves
    try:
        return loads_line(value)
    except Exception as exc:  # any failure parsing one record is that record's problem
        hint = "" if "raw" in payload else _PLAIN_COLUMN
        raise RecordProblem("malformed", _parse_problem(exc) + hint) from exc


_PLAIN_COLUMN = (
    "; a chat dataset's column holds each record as JSON or its messages as a list (a column "
    "of plain text is read as text when render_chat.text_datasets names its dataset)"
)


class RenderChat(Operator):
    """Renders chat (``messages``) or prompt/completion records into tokens and a loss mask."""

    op_name = "render_chat"
    default_microbatch_size = 64

    def output_tensors(self) -> tuple[str, ...]:
        """``input_ids`` and the ``loss_mask`` aligned with them."""
        return ("input_ids", "loss_mask")

    def traits(self) -> OpTraits:
        """One record in, one record out, in input order; stateless micro-batches."""
        return OpTraits(preserves_cursor_order=True)

    def __init__(
        self,
        *,
        tokenizer: str,
        messages_field: str = "messages",
        template: str | None = None,
        train_on: str = "assistant",
        max_length: int | None = None,
        system_prompt: str | None = None,
        prompt_field: str = "prompt",
        completion_field: str = "completion",
        completion_eos: bool = True,
        max_messages: int = 1024,
        date: str = "2025-01-01",
        reasoning_field: str = "reasoning_content",
        train_reasoning: bool = True,
        tools_field: str = "tools",
        weight_field: str = "weight",
        template_kwargs: dict[str, Any] | None = None,
        role_key: str = "role",
        content_key: str = "content",
        role_names: dict[str, str] | None = None,
        text_datasets: list[str] | None = None,
        text_bos: bool = False,
        text_eos: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_params(locals())
        self.keys = Keys(role_key, content_key, role_names)
        self.tokenizer_spec = tokenizer
        self.messages_field = messages_field
        self.template_path = template
        self.train_on = train_on
        self.max_length = max_length
        self.system_prompt = system_prompt
        self.prompt_field = prompt_field
        self.completion_field = completion_field
        self.completion_eos = completion_eos
        self.max_messages = max_messages
        self.date = date
        self.reasoning_field = reasoning_field
        self.train_reasoning = train_reasoning
        self.tools_field = tools_field
        self.weight_field = weight_field
        self.template_kwargs = dict(template_kwargs or {})
        self.texts = TextDatasets(text_datasets, text_bos, text_eos)
        self._warned_unwritten = False
        self._warned_cut = False
        self._warned_both = False
        self._tokenizer: Tokenizer | None = None
        self._template: ChatTemplate | None = None
        self._skeletons: Skeletons | None = None
        self.texts.check_tokenizer(self.tokenizer)  # also loads it: fails fast on a bad path
        self.source: TemplateSource = find_template(tokenizer, template)
        #: Whether the template (or its "tool_use" one) names the reasoning field at all: one
        #: that never does (Qwen2.5's, Llama 3.2's) leaves every reasoning out.
        self._writes_reasoning = any(
            reasoning_field in text for text in (self.source.text, self.source.tool_use or "")
        )
        unread = self.chat_template.unread_variables()  # compiled now: a syntax error is a
        if unread:  # config error, and so is a variable that would change nothing
            reads = sorted(self.chat_template.reads - set(RESERVED_VARIABLES))
            raise ConfigError(
                f"render_chat: template_kwargs.{unread[0]}: the chat template "
                f"({self.source.origin}) never reads {unread[0]!r}, so it would change nothing "
                f"(a misspelt name?); the template reads {reads[:16]}"
            )
        self.eos_id = self._eos_id()
        #: What the tokenizer's post-processor writes before a text (Llama 3's BOS): a
        #: prompt/completion record starts with it, as ``tokenizer(prompt + completion)``.
        self.prefix = tuple(getattr(self.tokenizer, "added_prefix", tuple)())
        self._probe_template()

    def _probe_template(self) -> None:
        """Warn at construction when the template fails on the plainest conversation (a
        user turn and an answer): it would then fail (or, under ``on_error: skip``, skip)
        every record, which the run would otherwise show only as a flood of errors or an
        empty stream."""
        probe = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]
        if self.system_prompt is not None:
            probe.insert(0, {"role": "system", "content": self.system_prompt})
        try:
            self.chat_template.render(probe)
        except ChatTemplateError as exc:
            log.warning(
                "render_chat: the chat template (%s) fails on a plain conversation of a user "
                "turn and an answer (%s): every record may be a chat_error; check the template",
                self.source.origin,
                exc,
            )

    def check_datasets(self, datasets: Sequence[Any]) -> None:
        """:class:`ConfigError` when ``text_datasets`` names a dataset the pipeline lacks, or
        one that reads records of several columns."""
        self.texts.check_names([spec.name for spec in datasets])
        for spec in datasets:
            if spec.name in self.texts.names and spec.record_columns:
                raise ConfigError(
                    f"dataset {spec.name!r} is in render_chat.text_datasets, whose records are "
                    "one text (its text_field), and has record_columns: remove one of the two"
                )

    def setup(self, ctx: OpContext) -> None:
        """Resolve ``text_datasets`` to dataset ids."""
        super().setup(ctx)
        self.texts.resolve([info.spec.name for info in ctx.datasets])

    # -- configuration -----------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        """The loaded tokenizer (loaded lazily after unpickling in a worker)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_spec)
        return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        """The compiled template (compiled lazily after unpickling in a worker)."""
        if self._template is None:
            day = datetime.date.fromisoformat(self.date)
            self._template = ChatTemplate(self.source, date=day, variables=self.template_kwargs)
        return self._template

    @property
    def skeletons(self) -> Skeletons:
        """The skeletons of the conversation shapes met (:mod:`..chat_skeleton`)."""
        if self._skeletons is None:
            self._skeletons = Skeletons(self.chat_template, field=self.reasoning_field)
        return self._skeletons

    def _eos_id(self) -> int:
        """The EOS appended to completions: the template's ``eos_token`` if the tokenizer
        knows it, else the tokenizer's own EOS; -1 when there is none."""
        eos = self.source.special_tokens.get("eos_token")
        lookup = getattr(self.tokenizer, "token_id", None)
        if isinstance(eos, str) and lookup is not None:
            found = lookup(eos)
            if found is not None:
                return int(found)
        return int(self.tokenizer.eos_id)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tokenizer"] = None
        state["_template"] = None
        state["_skeletons"] = None
        return state

    def params(self) -> dict[str, Any]:
        return {
            "tokenizer": self.tokenizer.identity,
            "template": self.source.identity,
            "special_ids": [self.eos_id, self.tokenizer.pad_id],  # completions' EOS, padding
            "messages_field": self.messages_field,
            "train_on": self.train_on,
            "max_length": self.max_length,
            "system_prompt": self.system_prompt,
            "prompt_field": self.prompt_field,
            "completion_field": self.completion_field,
            "completion_eos": self.completion_eos,
            "max_messages": self.max_messages,
            "date": self.date,
            "reasoning_field": self.reasoning_field,
            "train_reasoning": self.train_reasoning,
            "tools_field": self.tools_field,
            "weight_field": self.weight_field,
            "template_kwargs": self.template_kwargs,
            **self.keys.params(),
            "layout": LAYOUT_VERSION,
            **self.texts.params(),
        }

    def describe(self) -> str:
        return (
            f"render_chat(tokenizer={self.tokenizer.name!r}, template={self.source.origin!r}, "
            f"train_on={self.train_on}, max_length={self.max_length}{self.texts.describe()})"
        )

    # -- per record --------------------------------------------------------------------------

    def _render(self, rec: SampleRecord) -> Rendered:
        """The text and trained ranges of one record (raises :class:`RecordProblem`)."""
        if rec.meta.dataset_id in self.texts.ids:
            return self._plain_text(rec)
        obj = _record_object(rec.payload)
        if isinstance(obj, dict) and self.messages_field not in obj:
            prompt, completion = obj.get(self.prompt_field), obj.get(self.completion_field)
            if isinstance(prompt, list) and isinstance(completion, list):
                both = f"{self.prompt_field}+{self.completion_field}"  # names message i of both
                return self._chat(obj, prompt + completion, both, len(prompt))
            if prompt is not None or completion is not None:
                return self._prompt_completion(prompt, completion)
            raise RecordProblem(
                CHAT_ERROR,
                f"missing messages field {self.messages_field!r} (and no "
                f"{self.prompt_field!r}/{self.completion_field!r}; fields: {sorted(obj)[:8]}; "
                "a dataset of plain text is trained whole when render_chat.text_datasets "
                "names it)",
            )
        if isinstance(obj, dict):
            if not self._warned_both and self.prompt_field in obj and self.completion_field in obj:
                self._warn_both(rec)
            return self._chat(obj, obj[self.messages_field], self.messages_field)
        return self._chat(obj, obj, self.messages_field)

    def _chat(self, obj: Any, value: Any, field: str, first_trained: int = 0) -> Rendered:
        """A conversation rendered and laid out; no message before ``first_trained`` (a
        conversational prompt's) is trained."""
        try:
            messages = check_messages(renamed(value, field, self.keys), field, self.max_messages)
            tools = (
                check_tools(obj.get(self.tools_field), self.tools_field)
                if isinstance(obj, dict)
                else None
            )
            if self.system_prompt is not None and messages[0]["role"] != "system":
                messages = [{"role": "system", "content": self.system_prompt}, *messages]
                if first_trained:
                    first_trained += 1  # the prompt starts with it
            reasoning = self.reasoning_field if self.train_reasoning else None
            layout = layout_chat(
                self.chat_template,
                messages,
                self.train_on,
                self.skeletons,
                reasoning,
                tools,
                self.weight_field,
                first_trained,
                None if self._writes_reasoning else self.reasoning_field,
            )
        except ChatError as exc:
            raise RecordProblem(CHAT_ERROR, str(exc)) from exc
        return Rendered(layout.text, layout.trained, False, "chat", layout.unwritten_reasoning)

    def _plain_text(self, rec: SampleRecord) -> Rendered:
        """A record of a ``text_datasets`` dataset (:mod:`..chat_text`): its text trained
        whole, as ``decode_text`` + ``tokenize`` make it."""
        spec = self.ctx.datasets[rec.meta.dataset_id].spec
        text, problem = _text_of(rec.payload, spec.text_field)
        if problem is not None:
            hint = self.texts.chat_hint(rec.payload, self.messages_field, spec.name)
            raise RecordProblem("malformed", problem + hint)
        self.texts.warn_if_chat(rec, self.messages_field, self._where(rec))
        prefix = (self.tokenizer.bos_id,) if self.texts.bos else ()
        trained = ((0, len(text)),) if text else ()
        return Rendered(text, trained, self.texts.eos, "text", None, prefix)

    def _prompt_completion(self, prompt: Any, completion: Any) -> Rendered:
        for name, value in ((self.prompt_field, prompt), (self.completion_field, completion)):
            if not isinstance(value, str):
                raise RecordProblem(
                    CHAT_ERROR,
                    f"field {name!r} must be a string, got {type(value).__name__} (a prompt "
                    "and a completion are both strings, or both lists of messages)",
                )
        start = len(prompt)
        trained = ((start, start + len(completion)),) if completion else ()
        eos = self.completion_eos and self.eos_id >= 0
        return Rendered(prompt + completion, trained, eos, "prompt/completion", None, self.prefix)

    def _tokens(self, rendered: Rendered, ids: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        """The payload of a rendered record, after the mask checks (raises RecordProblem)."""
        if rendered.append_eos:
            eos = self.tokenizer.eos_id if rendered.kind == "text" else self.eos_id
            ids = np.append(ids, np.int32(eos)).astype(np.int32)
            mask = np.append(mask, MASK_DTYPE(1))
        trained = int(np.count_nonzero(mask))
        if not trained:
            text = rendered.kind == "text"
            raise RecordProblem(
                MASK_EMPTY,
                f"nothing to learn: no token of this {rendered.kind} record is trained "
                f"({_EMPTY[rendered.kind]}"
                + (" without text_eos)" if text else f" under train_on: {self.train_on})"),
                EMPTY_FIX if text else None,
            )
        if trained == len(mask) and rendered.kind != "text":
            raise RecordProblem(
                MASK_FULL,
                f"every token of this {rendered.kind} record would be trained (nothing is "
                "masked: no prompt, role header or template text)",
            )
        if rendered.prefix:  # after the checks: a BOS is not a prompt
            ids = np.concatenate([np.asarray(rendered.prefix, dtype=np.int32), ids])
            mask = np.concatenate([trained_prefix(rendered.prefix, rendered.kind), mask])
        cut = self.max_length is not None and rendered.kind != "text"  # texts are split
        if cut and len(ids) > cast(int, self.max_length):
            ids, mask = ids[: self.max_length], mask[: self.max_length]
            if not mask.any():
                raise RecordProblem(
                    MASK_TRUNCATED,
                    f"max_length {self.max_length} cuts away every trained token (the first "
                    "trained token comes later)",
                )
        return {"input_ids": np.ascontiguousarray(ids, dtype=np.int32), "loss_mask": mask}

    # -- the operator ------------------------------------------------------------------------

    def process_many(self, elems: list[Any]) -> list[Any]:
        rendered: list[Rendered | RecordProblem] = []
        for rec in elems:
            try:
                rendered.append(self._render(rec))
            except RecordProblem as bad:
                rendered.append(bad)
            except Exception as exc:  # whatever else fails on one record
                why = f"cannot render the record ({describe_exception(exc)})"
                rendered.append(RecordProblem(CHAT_ERROR, why))
        self._warn_unwritten(elems, rendered)
        good = [i for i, r in enumerate(rendered) if isinstance(r, Rendered)]
        encoded = self._encode([r for r in rendered if isinstance(r, Rendered)])
        tokens: dict[int, tuple[np.ndarray, np.ndarray] | RecordProblem] = dict(zip(good, encoded))
        out: list[Any] = []
        for i, rec in enumerate(elems):
            item = rendered[i]
            try:
                if isinstance(item, RecordProblem):
                    raise item
                result = tokens[i]
                if isinstance(result, RecordProblem):
                    raise result
                payload = self._tokens(item, *result)
            except RecordProblem as problem:
                out.append(self._failed(rec, problem))
                continue
            if item.kind == "text":
                out.extend(self.texts.pieces(rec, payload, self.max_length))
                continue
            n = len(payload["input_ids"])
            if n == self.max_length and not self._warned_cut:
                self._warn_cut(rec, len(result[0]) + item.append_eos)
            out.append(SampleRecord(payload, rec.meta.with_spans((Span(rec.meta.doc, 0, n),))))
        return out

    def _warn_unwritten(self, elems: list[Any], rendered: list[Rendered | RecordProblem]) -> None:
        """Log once that the template leaves out a trained message's reasoning (it is then
        neither in the text nor trained): the first record it happened to."""
        if self._warned_unwritten:
            return
        for rec, item in zip(elems, rendered):
            if isinstance(item, Rendered) and item.unwritten_reasoning is not None:
                self._warned_unwritten = True
                log.warning(
                    "render_chat: the chat template (%s) does not write the %s of message %d "
                    "of %s, so that reasoning is neither in the tokens nor trained (Qwen3's "
                    "template, for one, writes only the reasoning of the turns after the last "
                    "user message). Logged once per worker.",
                    self.source.origin,
                    self.reasoning_field,
                    item.unwritten_reasoning,
                    self._where(rec),
                )
                return

    def _warn_cut(self, rec: SampleRecord, tokens: int) -> None:
        """Log once that conversations longer than ``max_length`` lose their end (the first
        record it happened to)."""
        if tokens <= cast(int, self.max_length):
            return
        self._warned_cut = True
        log.warning(
            "render_chat: conversations longer than max_length %d tokens are cut, their end "
            "neither seen nor trained (the first: %s, %d tokens); raise render_chat.max_length "
            "to the model's context length if that is not intended. Logged once per worker.",
            self.max_length,
            self._where(rec),
            tokens,
        )

    def _warn_both(self, rec: SampleRecord) -> None:
        """Log once that records hold both a conversation and a prompt and completion: the
        conversation is what is rendered (a lone ``prompt`` beside ``messages``, as UltraChat
        keeps its first user turn, is not warned about)."""
        self._warned_both = True
        log.warning(
            "render_chat: %s has %r and also %r and %r: its %s are rendered and trained, its "
            "%s and %s are not read. Set render_chat.messages_field to a field the records do "
            "not have to train the prompt/completion pairs instead. Logged once per worker.",
            self._where(rec),
            self.messages_field,
            self.prompt_field,
            self.completion_field,
            self.messages_field,
            self.prompt_field,
            self.completion_field,
        )

    def _where(self, rec: SampleRecord) -> str:
        """The record's file and line (or row), or its cursor outside a pipeline run."""
        datasets = getattr(getattr(self, "ctx", None), "datasets", ())
        if not datasets or rec.meta.doc is None:
            return f"record {rec.meta.cursor}"
        return location(datasets[rec.meta.dataset_id], rec.meta.doc)

    def _encode(self, items: list[Rendered]) -> list[tuple[np.ndarray, np.ndarray] | RecordProblem]:
        """Ids and loss mask of each text (:mod:`..token_masks`): one batched call, or one
        per text if it raises."""
        tok = self.tokenizer
        ranges = [byte_ranges(r.text, r.trained) for r in items]
        try:
            return list(encode_masks(tok, [r.text for r in items], ranges))
        except Exception:  # find the record(s) at fault below, one by one
            pass
        out: list[tuple[np.ndarray, np.ndarray] | RecordProblem] = []
        for r, trained in zip(items, ranges):
            try:
                out.append(encode_masks(tok, [r.text], [trained])[0])
            except Exception as exc:  # one record's failure is that record's problem
                out.append(RecordProblem("tokenize_error", tokenizer_problem(r.text, exc)))
        return out

    def _failed(self, rec: SampleRecord, problem: RecordProblem) -> SampleRecord:
        """The tombstone (``on_error: skip``) of a bad record, or the error (``fail``)."""
        datasets = getattr(getattr(self, "ctx", None), "datasets", ())
        text = f"render_chat: {problem.problem}"
        if not datasets or rec.meta.doc is None:
            raise DataError(f"{text} (record {rec.meta.cursor})") from problem
        info = datasets[rec.meta.dataset_id]
        return on_bad_record(rec, info, problem.reason, text, fix=problem.fix)


def _check_params(values: dict[str, Any]) -> None:
    """ConfigError naming the parameter and value for every invalid parameter."""
    for name in (
        "tokenizer",
        "messages_field",
        "prompt_field",
        "completion_field",
        "reasoning_field",
        "tools_field",
        "weight_field",
    ):
        if not isinstance(values[name], str) or not values[name]:
            raise ConfigError(
                f"render_chat: {name} must be a non-empty string, got {values[name]!r}"
            )
    _check_template_kwargs(values["template_kwargs"])
    if values["weight_field"] in ("role", "content", values["reasoning_field"], *TOOL_FIELDS):
        raise ConfigError(
            f"render_chat: weight_field must name a message's 0-or-1 training switch, not its "
            f"{values['weight_field']!r} (the default is weight)"
        )
    if values["reasoning_field"] in ("role", "content", *TOOL_FIELDS):
        raise ConfigError(
            f"render_chat: reasoning_field must name the field holding a message's reasoning, "
            f"not its {values['reasoning_field']!r} (the default is reasoning_content)"
        )
    others = (values["messages_field"], values["prompt_field"], values["completion_field"])
    if values["tools_field"] in others:
        raise ConfigError(
            f"render_chat: tools_field must name the record's field of tool definitions, not "
            f"its {values['tools_field']!r} field (the default is tools)"
        )
    if values["template"] is not None and not isinstance(values["template"], str):
        raise ConfigError(f"render_chat: template must be a file path, got {values['template']!r}")
    if values["train_on"] not in TRAIN_ON:
        raise ConfigError(
            f"render_chat: train_on must be one of {TRAIN_ON}, got {values['train_on']!r}"
        )
    for name, minimum in (("max_length", 1), ("max_messages", 1)):
        value = values[name]
        if (value is not None or name == "max_messages") and (
            not isinstance(value, int) or isinstance(value, bool) or value < minimum
        ):
            raise ConfigError(f"render_chat: {name} must be an integer >= {minimum}, got {value!r}")
    if values["system_prompt"] is not None and not isinstance(values["system_prompt"], str):
        raise ConfigError(
            f"render_chat: system_prompt must be a string, got {values['system_prompt']!r}"
        )
    for flag in ("completion_eos", "train_reasoning"):
        if not isinstance(values[flag], bool):
            raise ConfigError(f"render_chat: {flag} must be true or false, got {values[flag]!r}")
    try:
        datetime.date.fromisoformat(values["date"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"render_chat: date must be an ISO date like 2025-01-01, got {values['date']!r}"
        ) from exc


def _check_template_kwargs(value: Any) -> None:
    """``template_kwargs``: a mapping of variable names to JSON-like values (a config error
    otherwise), none of them a variable every render sets itself."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ConfigError(
            f"render_chat: template_kwargs must be a mapping of template variables, got "
            f"{type(value).__name__} (e.g. template_kwargs: {{enable_thinking: false}})"
        )
    for name, item in value.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"render_chat: template_kwargs: {name!r} is not a variable name")
        if name in RESERVED_VARIABLES:
            raise ConfigError(
                f"render_chat: template_kwargs may not set {name!r}: every render sets it "
                "(messages and tools come from the record; raise_exception and strftime_now "
                "are the template's helpers, the date is render_chat.date)"
            )
        try:
            json.dumps(item, allow_nan=False)
        except (TypeError, ValueError):
            raise ConfigError(
                f"render_chat: template_kwargs.{name} must be a string, number, boolean, null, "
                f"list or mapping, got {type(item).__name__}"
            ) from None
