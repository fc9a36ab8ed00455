"""Chat slots: the texts of a conversation that its shape leaves out.

A conversation's *shape* (:func:`shape_of`) is what its rendering may depend on besides the
texts it carries; conversations of one shape share a skeleton (:mod:`.chat_skeleton`), the
rendering cut at the *slots* where those texts go. The slots of a conversation of ``n``
messages, numbered as every skeleton, trace and placement numbers them:

* ``j`` (``0 <= j < n``): message ``j``'s content;
* ``n + j``: message ``j``'s reasoning (a non-empty string in the reasoning field, such as
  ``reasoning_content``), when it has one;
* ``2n + k``: the ``k``-th *tool text*: each non-empty string in a message's ``tool_calls``
  (a call's function name, its arguments when they are a string, each string among its
  arguments when they are a mapping, its id), and a message's ``tool_call_id``, in message
  order, then in the order written in the record (depth first). Strings under a ``type`` key
  stay in the shape (templates compare them: ``tool_call.type == 'function'``), and so does
  whatever lies deeper than :data:`MAX_DEPTH` or after the first :data:`MAX_TOOL_SLOTS`.

Without tool texts as slots, every record with its own call arguments was a shape of its own,
and paid for its skeleton every time. A template may write a tool text verbatim, or inside
``tojson`` (JSON-escaped); which one is learned per shape (:mod:`.chat_trace`) and checked
against every real rendering (:func:`.chat_skeleton.place`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

#: One message of a shape: its role (a role and a non-empty content, the common case), or
#: ``(fields, empty)`` with its fields but the content in a canonical form. A string never
#: equals a tuple, so no role can pass for another message's fields.
Part = str | tuple[str, bool]
#: The fields of a message that hold tool texts.
TOOL_FIELDS = ("tool_calls", "tool_call_id")
#: Deepest nesting inside a tool field whose strings are slots (deeper ones stay in the shape).
MAX_DEPTH = 8
#: Tool texts of a conversation that are slots (the first ones in slot order; later ones stay
#: in the shape): bounds a skeleton's markers and a trace's stand-ins per conversation.
MAX_TOOL_SLOTS = 1024
#: What a slot reads as in a shape's fields (its text is not part of the shape).
_SLOT = "\ue000slot"


def shape_of(messages: Sequence[dict[str, Any]], field: str | None = None) -> tuple[Part, ...]:
    """What a conversation's rendering may depend on besides its slots (module docstring): the
    roles, every other field of a message (``name``, the structure of ``tool_calls``, ...) in a
    canonical form, and which contents are empty (templates write some turns differently then:
    their markers answer as the empty string, :class:`.chat_trace.EmptyStandIn`)."""
    slots = _SlotBudget()  # the first MAX_TOOL_SLOTS tool texts, across the messages
    return tuple(
        [
            m["role"]
            if len(m) == 2 and m["content"] != ""
            else (_fields(m, field, slots), m["content"] == "")
            for m in messages
        ]
    )


class _SlotBudget:
    """Stands in :data:`_SLOT` for the first :data:`MAX_TOOL_SLOTS` tool texts, None after."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_TOOL_SLOTS

    def __call__(self) -> str | None:
        if self.left <= 0:
            return None
        self.left -= 1
        return _SLOT


def shape_chars(shape: tuple[Part, ...]) -> int:
    """Characters of a shape's roles and fields."""
    return sum(len(part) if type(part) is str else len(part[0]) for part in shape)


def reasoning_slots(messages: Sequence[dict[str, Any]], field: str | None) -> tuple[int, ...]:
    """The messages whose ``field`` is a non-empty string: slot ``len(messages) + j`` each."""
    if field is None:
        return ()
    return tuple(j for j, m in enumerate(messages) if len(m) > 2 and is_slot(m.get(field)))


def droppable(message: dict[str, Any]) -> bool:
    """Whether a template may leave message's content slot out altogether: an assistant
    turn's empty content (Qwen2.5's and Llama 3.2's tool-call turns write only the calls). Its
    turn is then found from the generation prompt (:mod:`.chat_layout`)."""
    return message["role"] == "assistant" and message["content"] == ""


def is_slot(value: Any) -> bool:
    """Whether a reasoning or tool text is a slot: a non-empty string."""
    return type(value) is str and value != ""


def tool_texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    """The tool texts of ``messages`` in slot order (slot ``2n + k`` is the ``k``-th)."""
    out: list[str] = []
    for m in messages:
        if len(m) > 2:
            for key in TOOL_FIELDS:
                if key in m:
                    _collect(m[key], out, 0)
    return out


def unwritten_calls(messages: Sequence[dict[str, Any]], written: set[int]) -> int | None:
    """The first message with tool calls none of whose tool texts is among the ``written``
    slots (the template writes nothing of its calls); None when there is none. A message
    whose calls have no slot (no strings, or past :data:`MAX_TOOL_SLOTS`) cannot tell."""
    slot = 2 * len(messages)
    last = slot + MAX_TOOL_SLOTS
    for j, m in enumerate(messages):
        if len(m) <= 2:
            continue
        for key in TOOL_FIELDS:
            if key in m:
                texts: list[str] = []
                _collect(m[key], texts, 0)
                first, slot = slot, min(slot + len(texts), last)
                if key == "tool_calls" and first < slot and written.isdisjoint(range(first, slot)):
                    return j
    return None


def _collect(value: Any, out: list[str], depth: int) -> None:
    kind = type(value)
    if kind is str:
        if value and len(out) < MAX_TOOL_SLOTS:
            out.append(value)
    elif depth < MAX_DEPTH:
        if kind is dict:
            for key, item in value.items():
                if key != "type":
                    _collect(item, out, depth + 1)
        elif kind is list:
            for item in value:
                _collect(item, out, depth + 1)


def with_slots(
    messages: Sequence[dict[str, Any]],
    field: str | None,
    reasoning: Sequence[int],
    stand_in: Callable[[int], Any],
) -> list[dict[str, Any]]:
    """Copies of the messages with reasoning slot ``n + j`` (for ``j`` in ``reasoning``) and
    every tool text replaced by ``stand_in(slot)`` (a marker, or a traced value); contents as
    they are."""
    n = len(messages)
    out = [dict(m) if len(m) > 2 else m for m in messages]
    for j in reasoning:
        out[j][field] = stand_in(n + j)  # type: ignore[index]
    slots = itertools.count(2 * n)
    last = 2 * n + MAX_TOOL_SLOTS

    def next_stand_in() -> Any:
        slot = next(slots)
        return stand_in(slot) if slot < last else None  # None: past the bound, kept as is

    for m in out:
        if len(m) > 2:
            for key in TOOL_FIELDS:
                if key in m:
                    m[key] = _replaced(m[key], next_stand_in, 0)
    return out


def _replaced(value: Any, stand_in: Callable[[], Any], depth: int) -> Any:
    """``value`` with each string :func:`_collect` would take replaced by ``stand_in()``, in
    the same order (a string whose ``stand_in()`` is None stays)."""
    kind = type(value)
    if kind is str:
        if not value:
            return value
        standing = stand_in()
        return value if standing is None else standing
    if depth < MAX_DEPTH:
        if kind is dict:
            return {
                k: v if k == "type" else _replaced(v, stand_in, depth + 1) for k, v in value.items()
            }
        if kind is list:
            return [_replaced(v, stand_in, depth + 1) for v in value]
    return value


#: Keys in the order given, not sorted: a template writes a mapping in its order (``tojson``,
#: ``items()``), so two orders are two shapes. One encoder for every call (``json.dumps`` with
#: an option builds one per call).
_ENCODER = json.JSONEncoder(default=repr)


def _fields(message: dict[str, Any], field: str | None, slots: _SlotBudget) -> str:
    # The tool fields in slot order (as tool_texts and with_slots take them), whatever their
    # order in the record: past MAX_TOOL_SLOTS, which strings are slots must be the same here.
    tools = {key: _replaced(message[key], slots, 0) for key in TOOL_FIELDS if key in message}
    rest = {}
    for key, value in message.items():
        if key in tools:
            rest[key] = tools[key]
        elif key == field and is_slot(value):
            rest[key] = _SLOT
        elif key != "content":
            rest[key] = value
    return _ENCODER.encode(rest)


def tools_key(tools: Any) -> tuple[str, int]:
    """What a record's tool definitions (``tools``, written by templates such as Qwen3's in the
    system turn) add to its shape: a digest of their JSON, keys in order (a shape key of a
    bounded size, however many tools a record defines), and the JSON's length."""
    text = _ENCODER.encode(tools)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    return digest.hexdigest(), len(text)
