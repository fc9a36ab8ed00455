"""Chat layout: which characters of a rendered conversation belong to which message.

The loss mask of a chat must come from the rendering itself, never from searching the output
for special-token ids. :func:`layout_chat` renders the whole conversation once, and once more
with the content of every message it must attribute replaced by a marker of its own (private-
use characters no data contains). The text between the markers is what the template writes
around the contents (headers, separators, earlier and later turns); the real rendering must be
exactly that text with the contents put back, verbatim (or stripped of surrounding whitespace,
for templates that ``trim``), which gives each content's character range. Then, for each
trained message, the conversation *up to and including it* is rendered with its content
replaced by a marker: what follows the marker there is what the template writes when the turn
closes; the part the whole rendering also has after the content, without trailing newlines, is
the message's *end of turn* (``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama 3, ``</s>`` in
Mistral's format). A trained message contributes one character range: its content plus its end
of turn. Headers, separators and the newline after the end token are never trained.

A trained message's *reasoning* (a field such as ``reasoning_content``, which Qwen3's template
writes in a ``<think>`` block before the content) is placed the same way, with a marker of its
own; the turn is then trained from where the generation prompt ends (the conversation before
it rendered with ``add_generation_prompt``) to its end of turn: the opening tag, the reasoning,
the text up to the content, the content and the end of turn. A reasoning the template leaves
out is reported (:attr:`ChatLayout.unwritten_reasoning`), never guessed at.

Templates may render a turn differently when it is the last one (Qwen3 opens the final
assistant turn with an empty ``<think>`` block): only the full rendering places contents, so
that does not matter. A template that writes the text around a message differently depending
on its content, or rewrites a trained message's content, cannot be attributed: that is a
:class:`ChatError`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from .chat_skeleton import Misplaced, Skeleton, Skeletons, cut, place
from .chat_slots import droppable, reasoning_slots, unwritten_calls, with_slots
from .chat_template import ChatTemplate, ChatTemplateError
from .chat_trace import MARKER, stand_in, written_slots
from .chat_trace import marker as _marker

#: Which messages are trained: every assistant turn, the last one, or every turn.
TRAIN_ON = ("assistant", "last_assistant", "all")
ASSISTANT = "assistant"


class ChatError(Exception):
    """A conversation that cannot be rendered or attributed; the message says why and where."""


@dataclass(frozen=True)
class ChatLayout:
    """A rendered conversation and the character ranges ``[start, end)`` to train on."""

    text: str
    trained: tuple[tuple[int, int], ...]
    #: The first trained message whose reasoning the template does not write (None: none).
    unwritten_reasoning: int | None = None


def check_messages(value: Any, field: str, max_messages: int) -> list[dict[str, Any]]:
    """``value`` as a list of ``{role, content}`` mappings, or a :class:`ChatError`.

    A message that calls tools (a non-empty ``tool_calls`` list) may have a null content, as
    the OpenAI format writes it: it is read as the empty content."""
    if not isinstance(value, list):
        raise ChatError(f"field {field!r} must be a list of messages, got {type(value).__name__}")
    if not value:
        raise ChatError(f"field {field!r} is an empty list of messages")
    if len(value) > max_messages:
        raise ChatError(
            f"field {field!r} has {len(value)} messages, more than {max_messages} "
            "(render_chat.max_messages)"
        )
    nulls = False
    for i, message in enumerate(value):
        if type(message) is dict:  # the common case, checked inline
            role, content = message.get("role"), message.get("content")
            if type(content) is str and type(role) is str and role:
                if len(message) > 2 and None in message.values():
                    nulls = True  # a null field, such as OpenAI exports' "tool_calls": null
                continue
        _check_message(field, i, message)  # raises, unless a null content beside tool calls
        nulls = True
    if nulls:
        return [_without_nulls(m) for m in value]
    return value


def _without_nulls(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as templates see it from Hugging Face: a null field left out (as
    ``apply_chat_template`` leaves it out), a null content beside tool calls empty."""
    if None not in message.values():
        return message
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = message["content"] if message.get("content") is not None else ""
    return out


def _check_message(field: str, i: int, message: Any) -> None:
    """A :class:`ChatError` unless ``message`` is a mapping with a role and a string content
    (or a null one, in a message with tool calls)."""
    if not isinstance(message, dict):
        raise ChatError(f"{field}[{i}] must be an object, got {type(message).__name__}")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise ChatError(f"{field}[{i}] has no 'role' string (got {role!r})")
    if isinstance(content, str) or (content is None and _calls_tools(message)):
        return
    hint = " (null is read as empty only in a message with tool_calls)" if content is None else ""
    if isinstance(content, list):
        hint = (
            " (a list of parts, as OpenAI's [{'type': 'text', 'text': ...}], is not read: "
            "join the text parts into one string when converting the data)"
        )
    raise ChatError(
        f"{field}[{i}] ({role}): 'content' must be a string, got {type(content).__name__}{hint}"
    )


def check_tools(value: Any, field: str) -> list[Any] | None:
    """A record's tool definitions (``field``: a list of objects, or null or missing), or a
    :class:`ChatError`."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        got = type(value).__name__ if not isinstance(value, list) else "a list with non-objects"
        raise ChatError(
            f"field {field!r} must be a list of tool definitions (objects, as the OpenAI and "
            f"Hugging Face formats write them), got {got}"
        )
    return value


def _calls_tools(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` carries a non-empty ``tool_calls`` list."""
    calls = message.get("tool_calls")
    return isinstance(calls, list) and bool(calls)


def trained_indices(
    messages: Sequence[dict[str, Any]], train_on: str, weight: str | None = None
) -> list[int]:
    """Indices of the messages whose content (and end of turn) is trained: those ``train_on``
    selects, but any whose ``weight`` field is 0 (the OpenAI fine-tuning format's per-message
    switch); a ``weight`` other than 0 or 1 is a :class:`ChatError`."""
    if train_on == "all":
        chosen = list(range(len(messages)))
    else:
        assistants = [i for i, m in enumerate(messages) if m["role"] == ASSISTANT]
        chosen = assistants[-1:] if train_on == "last_assistant" else assistants
    if weight is None:
        return chosen
    off = {i for i, m in enumerate(messages) if len(m) > 2 and not _weighs(m, i, weight)}
    return [i for i in chosen if i not in off] if off else chosen


def _weighs(message: Mapping[str, Any], i: int, field: str) -> bool:
    """Whether ``message`` may be trained by its ``field`` (missing, null or 1: yes; 0: no)."""
    value = message.get(field)
    if value is None or (value == 1 and type(value) in (int, float, bool)):
        return True
    if value == 0 and type(value) in (int, float, bool):
        return False
    raise ChatError(
        f"message {i} ({message['role']}): {field!r} must be 0 (not trained) or 1, got {value!r}"
    )


def _render(template: ChatTemplate, messages: Sequence[dict[str, Any]]) -> str:
    try:
        return template.render(messages)
    except ChatTemplateError as exc:
        raise ChatError(str(exc)) from exc


def _content_ranges(
    template: ChatTemplate, messages: Sequence[dict[str, Any]], indices: list[int], full: str
) -> dict[int, tuple[int, int]]:
    """Message index -> characters ``[start, end)`` of its content in ``full``.

    One rendering of the whole conversation with every attributed message's content replaced
    by its own marker: the text between the markers is what the template writes around the
    contents, and ``full`` must be exactly that text with the contents put back (verbatim, or
    stripped for templates that ``trim``; a turn that is not the model's may also be written
    JSON-escaped, as Llama 3's template writes a tool's answer, and trains as written:
    :func:`_place_contents`)."""
    probe = _render(
        template,
        [
            {**m, "content": stand_in(_marker(i), m["content"])} if i in indices else m
            for i, m in enumerate(messages)
        ],
    )
    unwritten = [i for i in indices if droppable(messages[i]) and _marker(i) not in probe]
    written = [i for i in indices if i not in unwritten]
    try:
        ranges = _place_contents(cut(probe, written), messages, written, full)
    except Misplaced as bad:
        raise ChatError(_misplaced(bad, messages, written)) from None
    found = dict(zip(written, ranges))
    for i in unwritten:
        start = len(_opening(template, messages, i, full))
        found[i] = (start, start)
    return found


def _place_contents(
    pieces: list[str], messages: Sequence[dict[str, Any]], written: list[int], full: str
) -> list[tuple[int, int]]:
    """:func:`.chat_skeleton.place` for the contents of messages ``written``; a content of a
    turn that is not the model's that is not there verbatim (or trimmed) is looked for
    JSON-escaped too, as Llama 3's template writes a tool's answer (raises ``Misplaced``)."""
    contents = [messages[i]["content"] for i in written]
    escaped = [False] * len(written)
    while True:
        try:
            return place(pieces, contents, full, escaped)
        except Misplaced as bad:
            k = bad.k
            if bad.why != "content" or escaped[k] or messages[written[k]]["role"] == ASSISTANT:
                raise
            escaped[k] = True


def _check_written(
    template: ChatTemplate, messages: Sequence[dict[str, Any]], indices: list[int]
) -> None:
    """A :class:`ChatError` for a part of a message that the template writes nothing of, and
    that would silently be missing from the tokens: an untrained message's content (a role
    the template does not know, such as ShareGPT's ``human`` or a ``narrator``), or any
    message's tool calls (a template without tool support). The untrained contents and the
    tool texts are looked for as markers in one more rendering (as they are, in another case
    or JSON-escaped; a content's text found in the rendering proves nothing). (A skeleton's
    conversation needs no content check: every content but an empty assistant one is a slot
    it writes; its tool calls are checked when it is made.)"""
    trained = set(indices)
    suspects = [i for i, m in enumerate(messages) if i not in trained and m["content"].strip()]
    calls = any(len(m) > 2 and m.get("tool_calls") for m in messages)
    if not suspects and not calls:
        return
    probe_messages = [
        {**m, "content": _marker(i)} if i in suspects else m for i, m in enumerate(messages)
    ]
    if calls:
        probe_messages = with_slots(probe_messages, None, (), _marker)
    try:
        probe = template.render(probe_messages)
    except ChatTemplateError:
        return  # the template refuses a marker there: it reads the text, so it writes it
    written = written_slots(probe)
    for i in suspects:
        if i not in written:
            role = messages[i]["role"]
            raise ChatError(
                f"message {i} ({role}): the chat template writes nothing of its content, so it "
                f"would be missing from the tokens without a word (does the template know the "
                f"role {role!r}? map it to one it writes with render_chat.role_names, or "
                "remove such messages)"
            )
    unwritten = unwritten_calls(messages, written) if calls else None
    if unwritten is not None:
        raise _unwritten_calls(messages, unwritten)


def _unwritten_calls(messages: Sequence[dict[str, Any]], i: int) -> ChatError:
    return ChatError(
        f"message {i} ({messages[i]['role']}): the chat template writes nothing of its "
        "tool_calls, so the calls would be missing from the tokens without a word (a trained "
        "turn would teach the model to answer with its content alone); use a template that "
        "writes tool calls (render_chat.template), or remove the calls from the data"
    )


def _opening(template: ChatTemplate, messages: Sequence[dict[str, Any]], i: int, full: str) -> str:
    """The conversation before message ``i`` rendered with the generation prompt, which must
    be the start of ``full``: what the model writes of turn ``i`` starts where it ends."""
    opening = _render_prompt(template, messages[:i])
    if not full.startswith(opening):
        raise ChatError(
            f"message {i} ({messages[i]['role']}): the chat template leaves out its empty "
            "content and does not write the turn after the generation prompt, so the turn "
            "cannot be attributed"
        )
    return opening


_WHY = {
    "marker": "the chat template does not write the content exactly once",
    "around": "the chat template writes the text around this message differently depending on "
    "its content, so the turn cannot be attributed",
    "content": "the chat template changes the content (it is not written verbatim), so its "
    "tokens cannot be attributed",
}


def _misplaced(bad: Misplaced, messages: Sequence[dict[str, Any]], indices: list[int]) -> str:
    if bad.k >= len(indices):
        return (
            "the chat template writes the end of the conversation differently depending on the "
            "contents, so the turns cannot be attributed"
        )
    i = indices[bad.k]
    if bad.why == "around" and bad.k > 0:  # the text that differs follows the previous one
        j = indices[bad.k - 1]
        return (
            f"messages {j} ({messages[j]['role']}) to {i} ({messages[i]['role']}): the chat "
            "template writes the text between their contents differently depending on them, "
            "so the turns cannot be attributed"
        )
    if bad.why == "marker" and messages[i].get("tool_calls") and messages[i]["content"]:
        return (
            f"message {i} ({messages[i]['role']}): the chat template does not write the "
            "content of this tool-calling turn (templates such as Llama 3.2's write only the "
            "calls), so it would be neither in the tokens nor trained; give such turns an "
            "empty content, or use a template that writes it"
        )
    return f"message {i} ({messages[i]['role']}): {_WHY[bad.why]}"


def _close(template: ChatTemplate, messages: Sequence[dict[str, Any]], i: int) -> str:
    """What the template writes after message ``i``'s content when the conversation ends with
    it: the conversation rendered up to message ``i``, its content replaced by a marker."""
    message = messages[i]
    probe = _render(
        template, [*messages[:i], {**message, "content": stand_in(MARKER, message["content"])}]
    )
    at = probe.find(MARKER)
    if at >= 0:
        return probe[at + len(MARKER) :]
    if droppable(message):  # the turn's text after the generation prompt
        return probe[len(_opening(template, messages, i, probe)) :]
    raise ChatError(f"message {i}: the chat template does not write the content")


def _common_prefix(a: str, b: str) -> str:
    if b.startswith(a):  # the usual case: the whole tail is there
        return a
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


def layout_chat(
    template: ChatTemplate,
    messages: Sequence[dict[str, Any]],
    train_on: str,
    skeletons: Skeletons | None = None,
    reasoning: str | None = None,
    tools: list[Any] | None = None,
    weight: str | None = None,
    first_trained: int = 0,
    field_unread: str | None = None,
) -> ChatLayout:
    """Render ``messages`` and find the trained character ranges (module docstring).

    With ``skeletons`` (:mod:`.chat_skeleton`), a conversation whose rendering is its shape's
    skeleton with the contents put back takes one rendering instead of two or more, and none
    when its contents answer the template's questions as the shape's markers did. With
    ``reasoning`` (a field name, such as ``reasoning_content``), a trained message's reasoning
    that the template writes is trained too (:func:`_reasoning_starts`). ``tools``: the
    record's tool definitions, which every rendering sees (templates such as Qwen3's write them
    in the system turn; untrained, as everything a template writes but the trained turns).
    ``weight``: the message field whose 0 keeps a turn untrained (:func:`trained_indices`);
    ``first_trained``: no message before it is trained (a conversational prompt's).
    ``field_unread``: a reasoning field the template never names, so a message's non-empty
    value of it would be lost without a word: a :class:`ChatError`."""
    template = template.with_tools(tools)
    if tools and not template.reads_tools:
        raise ChatError(
            "the record has tool definitions but the chat template never reads 'tools', so "
            "they would be missing from the tokens without a word; use a template that writes "
            "them (render_chat.template), or point render_chat.tools_field at a field the "
            "records do not have if these are not tool definitions"
        )
    if reasoning is not None:
        for i, message in enumerate(messages):
            if len(message) > 2:  # a clear error before any template sees a bad reasoning
                _reasoning_of(message, i, reasoning)
    if field_unread is not None:
        _check_reasoning_read(messages, field_unread)
    skeleton = skeletons.get(messages, template) if skeletons is not None else None
    if skeleton is not None and skeleton.unwritten_calls is not None:
        raise _unwritten_calls(messages, skeleton.unwritten_calls)
    filled = skeleton.fill(messages) if skeleton is not None else None
    placed: list[tuple[int, int]] | None
    if filled is not None:
        full, placed = filled
    else:
        full = _render(template, messages)
        placed = skeleton.place(messages, full) if skeleton is not None else None
    if MARKER in full:
        raise ChatError("the conversation contains Zephon's private content marker")
    indices = [i for i in trained_indices(messages, train_on, weight) if i >= first_trained]
    if skeleton is not None and placed is not None:
        last = len(messages) - 1
        contents = _skeleton_contents(skeleton, indices, placed)
        closes = {i: skeleton.closing(i, placed, full) for i in indices if i != last}
        starts = _skeleton_starts(skeleton, messages, indices, placed, reasoning)
        if contents is not None and None not in closes.values() and starts is not None:
            found = cast(dict[int, str], closes)  # no None among them
            closing = _Closing(found.__getitem__, template)
            return _layout(messages, indices, full, contents, closing, starts)
    _check_written(template, messages, indices)
    contents = _content_ranges(template, messages, indices, full)
    closing = _Closing(functools.partial(_close, template, messages), template)
    starts = _reasoning_starts(template, messages, indices, full, contents, reasoning)
    return _layout(messages, indices, full, contents, closing, starts)


class _Closing(NamedTuple):
    """How trained turns close: ``tail(i)``, what the template writes after message ``i``'s
    content when the turn closes the conversation, and the ``template`` (its end of turn)."""

    tail: Callable[[int], str]
    template: ChatTemplate


def end_of_turn(template: ChatTemplate) -> str:
    """The text that closes an assistant turn in ``template`` (``<|im_end|>`` in ChatML,
    ``<|eot_id|>`` in Llama 3): what it writes after the reply of a two-turn conversation,
    without the :func:`conversation_end` and trailing newlines; "" when that probe fails or
    writes nothing. Computed once per template."""
    found = template.memo.get("end_of_turn")
    if found is None:
        ended, _ = _after_reply(template)
        found = _without_end(template, ended).rstrip("\n")
        template.memo["end_of_turn"] = found
    return str(found)


def conversation_end(template: ChatTemplate) -> str:
    """What ``template`` writes once after the last turn of a conversation that does not ask
    for a generation (Phi-3's ``{% else %}{{ eos_token }}``), which a turn followed by another
    one does not have: never part of the last turn's end of turn. "" for most templates
    (ChatML, Llama 3, Qwen3 write nothing there). Computed once per template from two probes,
    a reply that ends the conversation and one a user turn follows: the text the first has
    after the reply and the second has not. Where they part inside a special token of the
    tokenizer config (``<|endoftext|>`` against ``<|user|>``) the token is the end; else they
    part after a newline; when neither, nothing is taken for the end."""
    found = template.memo.get("conversation_end")
    if found is None:
        ended, followed = _after_reply(template)
        found = "" if followed.startswith(ended) else _parting(template, ended, followed)
        template.memo["conversation_end"] = found
    return str(found)


def _after_reply(template: ChatTemplate) -> tuple[str, str]:
    """What the template writes after a reply that ends the conversation, and after one a
    user turn follows (up to that turn's content); "" for a probe that fails."""
    found = []
    for after in ([], [{"role": "user", "content": "?"}]):
        probe = [{"role": "user", "content": "?"}, {"role": ASSISTANT, "content": MARKER}]
        try:
            text = template.render([*probe, *after])
        except ChatTemplateError:
            text = ""
        at = text.find(MARKER)
        found.append(text[at + len(MARKER) :] if at >= 0 else "")
    return found[0], found[1]


def _parting(template: ChatTemplate, ended: str, followed: str) -> str:
    core = ended.rstrip("\n")
    specials = [v for v in template.source.special_tokens.values() if isinstance(v, str) and v]
    for token in sorted(specials, key=len, reverse=True):
        if core.endswith(token) and followed.startswith(core[: -len(token)]):
            return ended[len(core) - len(token) :]
    shared = _common_prefix(ended, followed)
    cut = shared.rfind("\n") + 1
    return ended[cut:] if cut else ""


def _without_end(template: ChatTemplate, text: str) -> str:
    """``text`` (what follows a trained content up to the end of the rendering) without the
    template's :func:`conversation_end`."""
    end = conversation_end(template)
    return text[: -len(end)] if end and text.endswith(end) else text


def _layout(
    messages: Sequence[dict[str, Any]],
    indices: list[int],
    full: str,
    contents: Mapping[int, tuple[int, int]] | Sequence[tuple[int, int]],
    closing: _Closing,
    reasoning: tuple[dict[int, int], int | None],
) -> ChatLayout:
    """The layout from each trained content's range, how the turns close (``closing``) and
    ``reasoning``: where the turns with a written reasoning start, and the first trained
    message whose reasoning is not written.

    An assistant turn trains everything up to its end of turn (the calls a template writes
    after the content included: the model writes them). Any other turn (``train_on: all``)
    trains its content and, when its closing text ends with the template's end of turn, that
    end of turn: never the template text between them (Qwen's ``</tool_response>``)."""
    last = len(messages) - 1
    ranges: list[tuple[int, int]] = []
    starts, unwritten = reasoning
    for i in indices:
        start, content_end = contents[i]
        start = starts.get(i, start)
        if i == last:  # the whole rendering's text after the content shows how the turn closes
            end = content_end + len(_without_end(closing.template, full[content_end:]).rstrip("\n"))
        else:
            tail = _without_end(closing.template, closing.tail(i))
            found = _common_prefix(tail, full[content_end : content_end + len(tail)])
            end = content_end + len(found.rstrip("\n"))
        spans = [(start, end)]
        eot = end_of_turn(closing.template) if messages[i]["role"] != ASSISTANT else ""
        if messages[i]["role"] != ASSISTANT and full[content_end:end] != eot:
            spans = [(start, content_end)]  # not the model's turn: its content,
            if eot and full.endswith(eot, content_end, end):  # and the end of turn it ends with
                spans.append((end - len(eot), end))
        for span_start, span_end in spans:
            if ranges and span_start < ranges[-1][1]:
                raise ChatError(f"message {i}: its text overlaps the previous trained message")
            if span_end > span_start:
                ranges.append((span_start, span_end))
    return ChatLayout(full, tuple(ranges), unwritten)


def _reasoning_starts(
    template: ChatTemplate,
    messages: Sequence[dict[str, Any]],
    indices: list[int],
    full: str,
    contents: Mapping[int, tuple[int, int]] | Sequence[tuple[int, int]],
    field: str | None,
) -> tuple[dict[int, int], int | None]:
    """Where the trained range of each message with a written reasoning starts, and the first
    trained message whose reasoning the template leaves out (None: none).

    A message's reasoning (``field``, a non-empty string) is found as contents are: one
    rendering with it replaced by a marker, which the real rendering must equal with the
    reasoning put back. What the model writes of such a turn starts where the generation
    prompt ends (``<|im_start|>assistant\\n`` in ChatML): the conversation before the message,
    rendered with the generation prompt, must be the start of the real rendering. So the
    think block's opening tag, the reasoning, the text between it and the content, the content
    and the end of turn are trained; the role header is not."""
    if field is None or not any(_reasoning_of(messages[i], i, field) for i in indices):
        return {}, None
    starts: dict[int, int] = {}
    unwritten = None
    for i in indices:
        if not _reasoning_of(messages[i], i, field):
            continue
        at = _reasoning_at(template, messages, i, field, full)
        if at is None:
            unwritten = i if unwritten is None else unwritten
            continue
        opening = _render_prompt(template, messages[:i])
        if not full.startswith(opening) or not len(opening) <= at[0] <= at[1] <= contents[i][0]:
            raise _misplaced_reasoning(messages, i, field)
        starts[i] = len(opening)
    return starts, unwritten


def _skeleton_contents(
    skeleton: Skeleton, indices: list[int], placed: Sequence[Any]
) -> Mapping[int, tuple[int, int]] | Sequence[tuple[int, int]] | None:
    """Each trained content's range from a skeleton's slots; a content the template leaves
    out is empty where its turn starts (:meth:`.Skeleton.turn_start`). None when the skeleton
    cannot tell (then the conversation takes the renderings)."""
    if not skeleton.left_out:
        return placed
    contents: dict[int, tuple[int, int]] = {}
    for i in indices:
        if i in skeleton.left_out:
            start = skeleton.turn_start(i, placed)
            if start is None:
                return None
            contents[i] = (start, start)
        else:
            contents[i] = placed[i]
    return contents


def _skeleton_starts(
    skeleton: Skeleton,
    messages: Sequence[dict[str, Any]],
    indices: list[int],
    placed: Sequence[Any],
    field: str | None,
) -> tuple[dict[int, int], int | None] | None:
    """:func:`_reasoning_starts` from a skeleton's slots and the generation prompt it learned
    per shape, without rendering; None when the skeleton cannot tell (then the conversation
    takes the renderings)."""
    if field is None:
        return {}, None
    if skeleton.field != field:  # reasoning is not a slot of this skeleton
        return None if reasoning_slots(messages, field) else ({}, None)
    n = len(messages)
    starts: dict[int, int] = {}
    unwritten = None
    for i in indices:
        if i not in skeleton.slots:
            continue
        if placed[i] is None:
            return None  # a reasoning beside a content the template leaves out: render
        at = placed[n + i]
        if at is None:
            unwritten = i if unwritten is None else unwritten
            continue
        gap = skeleton.opening(i)
        if gap is None:
            return None
        if not (gap <= at[0] <= at[1] <= placed[i][0]):
            raise _misplaced_reasoning(messages, i, field)
        starts[i] = at[0] - gap
    return starts, unwritten


def _check_reasoning_read(messages: Sequence[dict[str, Any]], field: str) -> None:
    """:class:`ChatError` for the first message with a non-empty ``field`` (the reasoning a
    template that never names the field would leave out of the tokens without a word)."""
    for i, message in enumerate(messages):
        value = message.get(field) if len(message) > 2 else None
        if isinstance(value, str) and value.strip():
            raise ChatError(
                f"message {i} ({message.get('role')}) has a {field!r} but the chat template "
                f"never writes {field!r}, so that reasoning would be missing from the tokens "
                "without a word; use a template that writes it (render_chat.template), or "
                "point render_chat.reasoning_field at a field the records do not have to "
                "leave reasoning out"
            )


def _misplaced_reasoning(messages: Sequence[dict[str, Any]], i: int, field: str) -> ChatError:
    return ChatError(
        f"message {i} ({messages[i]['role']}): the chat template does not write its {field} "
        "between the generation prompt and the content, so the reasoning cannot be attributed "
        "(set render_chat.train_reasoning: false to train only the content)"
    )


def _reasoning_of(message: Mapping[str, Any], i: int, field: str) -> bool:
    """Whether ``message`` has a reasoning to train (a non-empty string ``field``); a
    :class:`ChatError` when the field holds anything but a string or null."""
    value = message.get(field)
    if value is None or isinstance(value, str):
        return bool(value)
    raise ChatError(
        f"message {i} ({message['role']}): {field!r} must be a string, got {type(value).__name__}"
    )


def _reasoning_at(
    template: ChatTemplate, messages: Sequence[dict[str, Any]], i: int, field: str, full: str
) -> tuple[int, int] | None:
    """The characters ``[start, end)`` of message ``i``'s reasoning in ``full``; None when the
    template does not write it (Qwen3's writes only the reasoning of turns after the last
    user message)."""
    probe = _render(
        template, [{**m, field: _marker(i)} if j == i else m for j, m in enumerate(messages)]
    )
    if _marker(i) not in probe:
        return None
    try:
        return place(cut(probe, [i]), [messages[i][field]], full)[0]
    except Misplaced:
        raise ChatError(
            f"message {i} ({messages[i]['role']}): the chat template does not write its {field} "
            "exactly once and verbatim, so the reasoning cannot be attributed (set "
            "render_chat.train_reasoning: false to train only the content)"
        ) from None


def _render_prompt(template: ChatTemplate, messages: Sequence[dict[str, Any]]) -> str:
    """``messages`` rendered with the generation prompt: the text before a model's reply."""
    try:
        return template.render(messages, generation_prompt=True)
    except ChatTemplateError as exc:
        raise ChatError(str(exc)) from exc
