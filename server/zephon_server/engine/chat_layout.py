"""Chat layout: which characters of a rendered conversation belong to which message.

The loss mask of a chat must come from the rendering itself, never from searching the output
for special-token ids. :func:`layout_chat` renders the whole conversation once, then, for each
message it must attribute, renders the conversation *up to and including that message* with
the message's content replaced by a marker (a private-use string no data contains). The text
before the marker is everything the template writes before the content (earlier turns and
this turn's header); it must be a prefix of the whole rendering, and the content must follow
it there verbatim (or stripped of surrounding whitespace, for templates that ``trim``). The
text after the marker is what the template writes after the content when the message is the
last one; the part of it the whole rendering also has after the content, without trailing
newlines, is the message's *end of turn* (``<|im_end|>`` in ChatML, ``<|eot_id|>`` in
Llama 3, ``</s>`` in Mistral's format). A trained message contributes one character range:
its content plus its end of turn. Headers, separators and the newline after the end token
are never trained.

A template that renders earlier turns differently depending on later ones (so no prefix of
the conversation renders as a prefix of the whole) cannot be attributed turn by turn: that is
a :class:`ChatError`, as is a template that rewrites a trained message's content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .chat_template import ChatTemplate, ChatTemplateError

#: Which messages are trained: every assistant turn, the last one, or every turn.
TRAIN_ON = ("assistant", "last_assistant", "all")
ASSISTANT = "assistant"
#: Stands in for a message's content to find where the template puts it.
MARKER = "\ue000zephon-content\ue001"


class ChatError(Exception):
    """A conversation that cannot be rendered or attributed; the message says why and where."""


@dataclass(frozen=True)
class ChatLayout:
    """A rendered conversation and the character ranges ``[start, end)`` to train on."""

    text: str
    trained: tuple[tuple[int, int], ...]


def check_messages(value: Any, field: str, max_messages: int) -> list[dict[str, Any]]:
    """``value`` as a list of ``{role, content}`` mappings, or a :class:`ChatError`."""
    if not isinstance(value, list):
        raise ChatError(f"field {field!r} must be a list of messages, got {type(value).__name__}")
    if not value:
        raise ChatError(f"field {field!r} is an empty list of messages")
    if len(value) > max_messages:
        raise ChatError(f"field {field!r} has {len(value)} messages, more than {max_messages}")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ChatError(f"{field}[{i}] must be an object, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ChatError(f"{field}[{i}] has no 'role' string (got {role!r})")
        if not isinstance(content, str):
            raise ChatError(
                f"{field}[{i}] ({role}): 'content' must be a string, got {type(content).__name__}"
            )
    return value


def trained_indices(messages: Sequence[dict[str, Any]], train_on: str) -> list[int]:
    """Indices of the messages whose content (and end of turn) is trained."""
    if train_on == "all":
        return list(range(len(messages)))
    assistants = [i for i, m in enumerate(messages) if m["role"] == ASSISTANT]
    return assistants[-1:] if train_on == "last_assistant" else assistants


def _render(template: ChatTemplate, messages: Sequence[dict[str, Any]]) -> str:
    try:
        return template.render(messages)
    except ChatTemplateError as exc:
        raise ChatError(str(exc)) from exc


def _turn_range(
    template: ChatTemplate, messages: Sequence[dict[str, Any]], i: int, full: str
) -> tuple[int, int]:
    """Characters of ``full`` trained for message ``i``: its content and end of turn."""
    message = messages[i]
    where = f"message {i} ({message['role']})"
    probe = _render(template, [*messages[:i], {**message, "content": MARKER}])
    pos = probe.find(MARKER)
    if pos < 0 or probe.find(MARKER, pos + 1) >= 0:
        raise ChatError(f"{where}: the chat template does not write the content exactly once")
    if full[:pos] != probe[:pos]:
        raise ChatError(
            f"{where}: rendering the conversation up to this message is not a prefix of "
            "rendering all of it (the template renders earlier turns differently depending "
            "on later ones), so the turn cannot be attributed"
        )
    content = message["content"]
    if not full.startswith(content, pos):
        content = content.strip()
        if not full.startswith(content, pos):
            raise ChatError(
                f"{where}: the chat template changes the content (it is not written verbatim), "
                "so its tokens cannot be attributed"
            )
    end = pos + len(content)
    tail = probe[pos + len(MARKER) :]
    closing = _common_prefix(tail, full[end : end + len(tail)]).rstrip("\n")
    return pos, end + len(closing)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


def layout_chat(
    template: ChatTemplate, messages: Sequence[dict[str, Any]], train_on: str
) -> ChatLayout:
    """Render ``messages`` and find the trained character ranges (module docstring)."""
    full = _render(template, messages)
    if MARKER in full:
        raise ChatError("the conversation contains Zephon's private content marker")
    ranges: list[tuple[int, int]] = []
    for i in trained_indices(messages, train_on):
        start, end = _turn_range(template, messages, i, full)
        if ranges and start < ranges[-1][1]:
            raise ChatError(f"message {i}: its text overlaps the previous trained message")
        if end > start:
            ranges.append((start, end))
    return ChatLayout(full, tuple(ranges))
