"""Chat skeletons: what a template writes around the texts of one conversation shape.

Finding the trained characters of a conversation (:mod:`.chat_layout`) takes renderings with
markers in place of contents: one of the whole conversation, and one per trained turn that is
not the last. Those renderings depend on the conversation's *shape* (its roles, and the fields
of its messages but the texts that are its slots, :mod:`.chat_slots`), not on what the
messages say, for every template that does not branch on them. A :class:`Skeletons` cache
keeps, per shape, the rendering with every *slot* (each content, each non-empty reasoning,
each tool text) replaced by a marker, cut at the markers (:class:`Skeleton`), and learns
lazily, per trained turn, what the template writes after a turn that closes the conversation
and where the generation prompt before a reasoning ends.

The cache never decides what is trained on its own. A conversation's real rendering must be
exactly its skeleton with the slots put back (verbatim, or stripped for templates that
``trim``, or JSON-escaped for tool texts written inside ``tojson``); when it is not (a
template that branches on contents, rewrites one, or drops one), :func:`layout_chat` falls
back to rendering this conversation's own markers. A skeleton also keeps the questions its
template asks of the slots (:mod:`.chat_trace`), when a traced rendering could follow them,
learned when its shape is met a second time (a trace costs more than a rendering, and a
shape met once does not repay it): a conversation whose slots answer them as the markers did
renders as the skeleton with its slots in place, and :meth:`Skeleton.fill` writes that
without rendering. The skeleton of a shape depends only on the shape, so which conversation
met a shape first never changes a result, on any runner or worker.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from . import chat_budget
from .chat_slots import (
    droppable,
    reasoning_slots,
    shape_chars,
    shape_of,
    tool_texts,
    tools_key,
    unwritten_calls,
    with_slots,
)
from .chat_template import ChatTemplate, ChatTemplateError, json_string
from .chat_trace import (
    MARKED,
    MARKER,
    Check,
    Tracer,
    holds,
    marker,
    slot_of,
    stand_in,
    written_slots,
)

_ABSENT: Any = object()
#: Shapes kept per operator (least recently used ones go first).
MAX_SHAPES = 4096
#: Largest shape kept, in characters of its roles and non-content fields: a shape carrying long
#: fields or hundreds of turns is rarely met twice.
MAX_SHAPE_CHARS = 4096
#: Characters the cache holds in all (each shape's roles and fields, its skeleton's text and
#: its tool definitions as JSON): records defining many tools make large skeletons.
MAX_CACHE_CHARS = 1 << 25


class Skeleton:
    """The rendering of one shape cut at its slots (the contents, and the reasoning the
    template writes): ``pieces[k]`` is the text before the ``k``-th slot written, ``order[k]``
    that slot (``j`` for message ``j``'s content, ``n + j`` for its reasoning), and
    ``pieces[-1]`` the text after the last one."""

    def __init__(
        self,
        template: ChatTemplate,
        messages: Sequence[dict[str, Any]],
        cut_at: tuple[list[str], list[int]],
        field: str | None = None,
    ) -> None:
        self._template = template
        self.field = field
        self.slots = reasoning_slots(messages, field)
        #: How many tool texts the shape has (slots ``2n`` to ``2n + tool_slots - 1``).
        self.tool_slots = len(tool_texts(messages))
        self._shape = markers_in(messages, field, self.slots)
        pieces, order = cut_at
        self.pieces = tuple(pieces)
        #: The slots in the order written; None for the contents alone, in order.
        self.order = None if order == list(range(len(messages))) else tuple(order)
        self._contents = range(len(messages))
        #: The contents the template leaves out (empty ones of assistant turns,
        #: :func:`.chat_slots.droppable`): their turns start where the generation prompt ends.
        self.left_out = frozenset(self._contents) - set(order)
        #: The first message whose tool calls the template writes nothing of (None: none).
        self.unwritten_calls = (
            unwritten_calls(messages, set(order) | written_slots("".join(pieces)))
            if self.tool_slots
            else None
        )
        self._starts: dict[int, tuple[int, int] | None] = {}
        #: The questions the template asks of the slots; None: every conversation of the
        #: shape is rendered (not traced yet, or the template does what a trace cannot follow).
        self.checks: tuple[Check, ...] | None = None
        #: The slots the template writes JSON-escaped (inside ``tojson``), learned by the trace.
        self.escaped: frozenset[int] = frozenset()
        self.traced = False
        self._closes: dict[int, tuple[list[str], list[int]] | None] = {}
        self._openings: dict[int, int | None] = {}

    def close(self, i: int) -> tuple[list[str], list[int]] | None:
        """What the template writes after message ``i``'s content when the conversation ends
        with message ``i``, cut at the markers of the tool texts it holds (the pieces and
        their slots; learned once per shape); None when it cannot tell."""
        if i not in self._closes:
            probe = _render(self._template, self._shape[: i + 1])
            at = -1 if probe is None else probe.find(marker(i))
            if probe is not None and at < 0 and i in self.left_out:
                at, anchor = self._prompt_in(probe, i)  # the turn follows the prompt
            else:
                anchor = len(marker(i))
            if probe is None or at < 0:
                self._closes[i] = None
            else:
                tail = probe[at + anchor :]
                slots = list(map(slot_of, MARKED.findall(tail)))
                tools = 2 * len(self._contents)  # a later content or reasoning: cannot tell
                self._closes[i] = (
                    (MARKED.split(tail), slots) if min(slots, default=tools) >= tools else None
                )
        return self._closes[i]

    def closing(self, i: int, placed: Sequence[Any], full: str) -> str | None:
        """:meth:`close` for one conversation of the shape: its tool texts (which a turn's
        close writes after its content) as ``full`` has them at their ``placed`` ranges."""
        cut_at = self.close(i)
        if cut_at is None:
            return None
        pieces, slots = cut_at
        if not slots:
            return pieces[0]
        parts = [pieces[0]]
        for slot, piece in zip(slots, pieces[1:]):
            where = placed[slot]
            if where is None:
                return None  # a tool text the rendering does not write
            parts += (full[where[0] : where[1]], piece)
        return "".join(parts)

    def opening(self, i: int) -> int | None:
        """How many characters before message ``i``'s reasoning the generation prompt ends
        (learned once per shape: the conversation before message ``i`` rendered with the
        generation prompt must be this skeleton up to there); None when it is not."""
        if i not in self._openings:
            self._openings[i] = self._learn_opening(i)
        return self._openings[i]

    def turn_start(self, i: int, placed: Sequence[Any]) -> int | None:
        """Where turn ``i``, whose content the template leaves out, starts in a conversation
        of the shape whose slots are ``placed``: where the generation prompt before it ends
        (learned once per shape: the conversation before message ``i`` rendered with the
        generation prompt must be this skeleton up to there); None when it is not."""
        found = self._start_of(i)
        if found is None:
            return None
        k, into = found  # the prompt ends ``into`` characters into piece k
        order = self.order or self._contents
        return (placed[order[k - 1]][1] if k else 0) + into

    def _start_of(self, i: int) -> tuple[int, int] | None:
        """(k, n): the generation prompt before message ``i`` ends ``n`` characters into
        piece ``k`` of this skeleton (learned once per shape); None when it is not its start."""
        if i not in self._starts:
            self._starts[i] = self._learn_start(i)
        return self._starts[i]

    def _learn_start(self, i: int) -> tuple[int, int] | None:
        order = self.order or self._contents
        probe = "".join(p + marker(o) for p, o in zip(self.pieces, order)) + self.pieces[-1]
        at, length = self._prompt_in(probe, i)
        if at < 0:
            return None
        end, pos = at + length, 0
        for k, piece in enumerate(self.pieces):
            if end <= pos + len(piece):
                return k, end - pos
            pos += len(piece) + (len(marker(order[k])) if k < len(order) else 0)
            if end < pos:
                return None  # the prompt ends inside a marker
        return None

    def _prompt_in(self, probe: str, i: int) -> tuple[int, int]:
        """(0, its length) when ``probe`` starts with the conversation before message ``i``
        rendered with the generation prompt, markers in place; (-1, 0) otherwise."""
        try:
            prompt = self._template.render(self._shape[:i], generation_prompt=True)
        except ChatTemplateError:
            return -1, 0
        return (0, len(prompt)) if probe.startswith(prompt) else (-1, 0)

    def _learn_opening(self, i: int) -> int | None:
        order = self.order or self._contents
        slot = len(self._shape) + i
        if slot not in order:
            return None
        k = list(order).index(slot)
        start = self._start_of(i)  # the prompt must end in the piece before the reasoning
        return None if start is None or start[0] != k else len(self.pieces[k]) - start[1]

    def trace(self, tracer: Tracer, messages: Sequence[dict[str, Any]]) -> None:
        """Learn the questions the template asks of the slots (:mod:`.chat_trace`), from
        any conversation of the shape, once: a shape met a second time is worth tracing."""
        if self.traced:
            return
        order = self.order or self._contents
        probe = "".join(p + marker(slot) for p, slot in zip(self.pieces, order))
        traced = tracer.checks(
            messages, probe + self.pieces[-1], self.field, self.slots, self._template.tools
        )
        if traced is not None:
            self.checks, self.escaped = traced.checks, traced.escaped
        self.traced = True

    def values(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        """The texts of the slots, by slot (:mod:`.chat_slots`): the contents, then (for a
        shape with reasoning or tool slots) the reasoning of each message that has one, None
        for the others, then the tool texts."""
        contents: list[Any] = [m["content"] for m in messages]
        if self.slots or self.tool_slots:
            field: Any = self.field
            contents += [m[field] if j in self.slots else None for j, m in enumerate(messages)]
            if self.tool_slots:
                contents += tool_texts(messages)
        return contents

    def fill(self, messages: Sequence[dict[str, Any]]) -> tuple[str, list[Any]] | None:
        """The rendering of ``messages`` and each slot's range ``[start, end)`` in it (by slot;
        None for a reasoning slot the template does not write), written without rendering
        when their slots answer the template's questions as the markers did
        (:mod:`.chat_trace`); None when they do not, or the shape has no checks (then the
        conversation is rendered)."""
        checks = self.checks
        values = self.values(messages)
        if checks is None or not holds(checks, values):
            return None
        parts: list[str] = []
        ranges: list[Any] = [None] * len(values)
        pos = 0
        escaped = self.escaped
        for piece, slot in zip(self.pieces, self.order or self._contents):
            value = values[slot] if slot not in escaped else json_string(values[slot])
            pos += len(piece)
            parts += (piece, value)
            ranges[slot] = (pos, pos + len(value))
            pos += len(value)
        parts.append(self.pieces[-1])
        full = "".join(parts)
        if len(full) > chat_budget.OUTPUT_BASE and (
            len(full) > self._template.budget(messages).output_limit()
        ):
            return None  # over the output budget: the rendering fails, with its error
        return full, ranges

    def place(self, messages: Sequence[dict[str, Any]], full: str) -> list[Any] | None:
        """Each slot's range ``[start, end)`` in ``full``, the real rendering (by slot, as
        :meth:`fill` gives them), when it is exactly this skeleton with the slots put back;
        None otherwise."""
        values = self.values(messages)
        order = self.order or self._contents
        tools = 2 * len(self._contents)  # the first tool slot
        try:
            written = [values[slot] for slot in order]
            placed = place(self.pieces, written, full, [slot >= tools for slot in order])
        except Misplaced:
            return None
        ranges: list[Any] = [None] * len(values)
        for slot, where in zip(order, placed):
            ranges[slot] = where
        return ranges


class Skeletons:
    """Skeletons of the shapes a template met: at most :data:`MAX_SHAPES` of them, none
    larger than :data:`MAX_SHAPE_CHARS`, :data:`MAX_CACHE_CHARS` in all. With ``field``, each
    message's non-empty reasoning in that field is a slot, as contents are
    (:func:`reasoning_slots`)."""

    def __init__(
        self, template: ChatTemplate, max_shapes: int = MAX_SHAPES, field: str | None = None
    ) -> None:
        self._template = template
        self._tracers = {id(template.source): Tracer(template)}  # one per template source
        self._max = max_shapes
        self._field = field
        # Keyed by shape, or by shape and a digest of the tool definitions.
        self._cache: OrderedDict[Any, Skeleton | None] = OrderedDict()
        self._weights: dict[Any, int] = {}  # key -> characters it holds
        self._held = 0
        self._lock = threading.Lock()  # the threads runner's workers share one operator

    def get(
        self, messages: Sequence[dict[str, Any]], template: ChatTemplate | None = None
    ) -> Skeleton | None:
        """The skeleton of ``messages``' shape, rendered by ``template`` (this cache's template
        bound to a record's tool definitions, :meth:`.ChatTemplate.with_tools`; by default the
        cache's own); None when the template does not write every content exactly once with
        markers in place (then nothing is cached but that)."""
        bound = self._template if template is None else template
        shape = shape_of(messages, self._field)
        key: Any = shape
        weight = shape_chars(shape)
        if bound.tools is not None:
            key = (shape, *tools_key(bound.tools))
            weight += key[2]
        # A hit takes no lock: each OrderedDict call is atomic under the GIL, and a shape
        # evicted by another thread in between only misses its refresh.
        found = self._cache.get(key, _ABSENT)
        if found is not _ABSENT:
            try:
                self._cache.move_to_end(key)
            except KeyError:
                pass
            if found is not None and not found.traced:
                # The same checks whoever traces first.
                found.trace(self._tracer(bound), messages)
            return found
        # The same for every caller. Not traced yet: a tracing costs a few renderings, and most
        # shapes of records with their own tool calls or fields are met once.
        skeleton = _build(bound, messages, self._field)
        if shape_chars(shape) > MAX_SHAPE_CHARS:
            return skeleton  # too big to keep (see MAX_SHAPE_CHARS)
        if skeleton is not None:
            weight += sum(map(len, skeleton.pieces))
        with self._lock:
            self._held += weight - self._weights.get(key, 0)
            self._cache[key] = skeleton
            self._weights[key] = weight
            while len(self._cache) > self._max or self._held > MAX_CACHE_CHARS:
                old, _ = self._cache.popitem(last=False)
                self._held -= self._weights.pop(old)
        return skeleton

    def _tracer(self, template: ChatTemplate) -> Tracer:
        """The tracer of ``template``'s source (another one for a "tool_use" template)."""
        tracer = self._tracers.get(id(template.source))
        if tracer is None:
            with self._lock:
                tracer = self._tracers.setdefault(id(template.source), Tracer(template))
        return tracer


def markers_in(
    messages: Sequence[dict[str, Any]], field: str | None = None, slots: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """``messages`` with every content replaced by its marker (:func:`.chat_trace.stand_in`),
    the ``field`` of the messages ``slots`` by marker ``len(messages) + j``, and each tool
    text by its slot's marker (:mod:`.chat_slots`)."""
    marked = [{**m, "content": stand_in(marker(j), m["content"])} for j, m in enumerate(messages)]
    return with_slots(marked, field, slots, marker)


def _render(template: ChatTemplate, messages: Sequence[dict[str, Any]]) -> str | None:
    try:
        return template.render(messages)
    except ChatTemplateError:
        return None  # the template refuses markers here: no skeleton, the slow path decides


def _build(
    template: ChatTemplate, messages: Sequence[dict[str, Any]], field: str | None = None
) -> Skeleton | None:
    slots = reasoning_slots(messages, field)
    probe = _render(template, markers_in(messages, field, slots))
    if probe is None:
        return None
    n = len(messages)
    optional = [n + j for j in slots] + list(range(2 * n, 2 * n + len(tool_texts(messages))))
    dropped = [j for j, m in enumerate(messages) if droppable(m)]
    try:
        cut_at = cut_slots(probe, n, optional, dropped)
    except Misplaced:
        return None
    return Skeleton(template, messages, cut_at, field)


class Misplaced(Exception):
    """A rendering that does not fit its marker rendering: ``k`` is the position (in the
    attributed messages) where it stops fitting, ``why`` one of ``marker`` (the template does
    not write that content exactly once, in order), ``around`` (the text before it differs),
    ``content`` (the content is not written verbatim or stripped) and ``end`` (the text after
    the last content differs)."""

    def __init__(self, k: int, why: str) -> None:
        super().__init__(k, why)
        self.k, self.why = k, why


def cut(probe: str, ids: Sequence[int]) -> list[str]:
    """``probe``, a rendering with the contents of messages ``ids`` replaced by their markers,
    cut at the markers: ``len(ids) + 1`` pieces (raises :class:`Misplaced`). One pass over
    the probe, however many markers it holds."""
    found = list(MARKED.finditer(probe))
    written = Counter(slot_of(m.group()) for m in found)
    for k, i in enumerate(ids):
        if written[i] != 1:
            raise Misplaced(k, "marker")  # not written exactly once
    if len(found) != len(ids):
        raise Misplaced(len(ids), "marker")  # a marker of another slot
    pieces, pos = [], 0
    for k, (match, i) in enumerate(zip(found, ids)):
        if slot_of(match.group()) != i:
            raise Misplaced(k, "marker")  # written out of order
        pieces.append(probe[pos : match.start()])
        pos = match.end()
    pieces.append(probe[pos:])
    if any(MARKER in piece for piece in pieces):
        raise Misplaced(len(ids), "marker")  # a marker that is not one of the numbered ones
    return pieces


def cut_slots(
    probe: str, n: int, optional: Sequence[int], dropped: Sequence[int] = ()
) -> tuple[list[str], list[int]]:
    """``probe``, a rendering with the ``n`` contents and the ``optional`` slots (reasoning,
    tool texts) replaced by their markers, cut at the markers it holds: the pieces and the
    slots in the order written. Every content must be written once, in order, but the
    ``dropped`` ones (:func:`.chat_slots.droppable`), which may be left out; an optional slot
    once or not at all (raises :class:`Misplaced`)."""
    if not optional and not dropped:
        return cut(probe, range(n)), list(range(n))
    allowed = set(optional)
    order = [slot_of(m.group()) for m in MARKED.finditer(probe)]
    if any(slot >= n and slot not in allowed for slot in order):
        raise Misplaced(n, "marker")  # a marker of no slot of this conversation
    contents = [slot for slot in order if slot < n]
    left_out = set(dropped) - set(contents)
    if contents != [j for j in range(n) if j not in left_out]:
        raise Misplaced(n, "marker")  # a content missing, repeated or out of order
    return cut(probe, order), order  # cut checks that each slot is written once


def place(
    pieces: Sequence[str],
    contents: Sequence[str],
    full: str,
    escapable: Sequence[bool] | None = None,
) -> list[tuple[int, int]]:
    """The range ``[start, end)`` of each of ``contents`` in ``full`` when ``full`` is exactly
    ``pieces`` with the contents put between them, each verbatim or trimmed as templates do
    (:func:`_written`), or for the ``escapable`` ones (tool texts) verbatim or JSON-escaped
    (written inside ``tojson``); raises :class:`Misplaced`."""
    out: list[tuple[int, int]] = []
    pos = 0
    for k, (piece, content) in enumerate(zip(pieces, contents)):
        if not full.startswith(piece, pos):
            raise Misplaced(k, "around")
        start = pos + len(piece)
        if escapable is not None and escapable[k]:
            written = _escaped(content, full, start, pieces[k + 1])
        else:
            written = _written(content, full, start, pieces[k + 1])
        if written is None:
            raise Misplaced(k, "content")
        pos = start + len(written)
        out.append((start, pos))
    if full[pos:] != pieces[-1]:
        raise Misplaced(len(contents), "end")
    return out


def _escaped(text: str, full: str, start: int, after: str) -> str | None:
    """A tool text as the template wrote it at ``start`` of ``full``, followed by ``after``:
    verbatim or JSON-escaped; None when neither is there."""
    for written in (text, json_string(text)):
        if full.startswith(written, start) and full.startswith(after, start + len(written)):
            return written
    return None


def _written(content: str, full: str, start: int, after: str) -> str | None:
    """``content`` as the template wrote it at ``start`` of ``full``, followed by ``after``:
    verbatim, or stripped of surrounding whitespace (Jinja's ``trim``), or of newlines on both
    sides or on the left (Qwen3 writes ``reasoning_content.strip('\\n')`` and
    ``content.lstrip('\\n')``), whichever ``after`` follows; None when none is there."""
    for written in (content, content.strip(), content.strip("\n"), content.lstrip("\n")):
        if full.startswith(written, start) and full.startswith(after, start + len(written)):
            return written
    # Written verbatim but followed by other text: the text around the next content differs.
    return content if full.startswith(content, start) else None
