"""Traced renderings: which conversations of a shape render as its skeleton, without rendering.

A shape's skeleton (:mod:`.chat_skeleton`) is its rendering with markers in place of its
slots (the contents, reasoning and tool texts, :mod:`.chat_slots`; "content" below stands for
any of them). Whether a conversation of that shape renders as the skeleton with its contents
put back depends only on what the template *does* with the contents. A traced rendering of the
shape finds out, once per shape: each content is an :class:`Opaque` value that

* is written out (``{{ content }}``) as its marker, alone or joined with text by ``+``
  (:class:`Joined`);
* answers questions (``'</think>' in content``, ``content == ''``, ``if content``,
  ``content.startswith(...)``, ``content is string`` and every other test) as its marker
  does, or as the empty string for an empty content (whose emptiness is part of the shape,
  :class:`EmptyStandIn`), and each question and answer is recorded;
* can be stripped (``content.strip()``, ``content.lstrip('\\n')``, ``| trim``) when that leaves
  the marker as it is: recorded as the question "does stripping leave it as it is?";
* for a tool text only, can be written inside ``tojson`` (a call's arguments, as Qwen3 writes
  them): the JSON is written with the marker where the escaped text goes (:class:`Escaped`),
  and the skeleton fills that slot JSON-escaped;

and can do nothing else. Anything else (``~``, ``| length``, ``split``, another filter,
formatting, hashing, iterating, indexing) ends the trace: the shape then has no checks, and
each of its conversations is rendered (the fallback of :func:`.chat_layout.layout_chat`). A
template that captures output as text (a macro, a ``{% call %}``, ``{% filter %}`` or
``{% set %}`` block) is not traced at all, and every marker in a traced rendering must be the
very string ``finalize`` wrote at the top level.

The template's path through a conversation of the shape is then a function of the recorded
answers alone, and the contents reach the output only where the markers are, verbatim. A
conversation whose contents give every recorded answer (:func:`holds`) renders exactly as
the skeleton with its contents in place; one that does not is rendered.
"""

from __future__ import annotations

import functools
import json
import operator
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import chat_budget
from .chat_slots import tool_texts, with_slots
from .chat_template import ChatTemplate, environment_class

#: Stands in for a message's content (private-use characters no data contains).
MARKER = "\ue000zephon-content\ue001"


def marker(i: int) -> str:
    """The marker standing in for message ``i``'s content (a new string on every call)."""
    return f"{MARKER}{i}\ue002"


class EmptyStandIn(str):
    """A marker standing in for an *empty* content: written out as the marker, it answers the
    questions templates ask of a content (``if content``, ``content | length``, ``content ==
    ''``, ``'x' in content``, ``startswith``, stripping) as the empty string does. Templates
    write some turns differently when the content is empty (Qwen's tool calls lose the newline
    before them), so a marker that answered as itself would lay out another turn than the real
    one. Anything else it answers as its marker does; a template that takes another path then
    does not fit the real rendering, and the conversation cannot be attributed (never a
    misplaced range: the placement checks the real rendering character by character)."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return other == ""

    def __ne__(self, other: object) -> bool:
        return other != ""

    def __hash__(self) -> int:
        return hash("")

    def __contains__(self, item: object) -> bool:
        return item == ""

    def startswith(self, prefix: Any, *args: Any) -> bool:  # type: ignore[override]
        return "".startswith(prefix, *args)

    def endswith(self, suffix: Any, *args: Any) -> bool:  # type: ignore[override]
        return "".endswith(suffix, *args)

    def strip(self, chars: str | None = None) -> EmptyStandIn:  # type: ignore[override]
        return self

    lstrip = rstrip = strip


def stand_in(marker: str, content: str) -> str:
    """What a probe rendering writes in place of ``content``: its marker, answering as the
    empty string for an empty content (:class:`EmptyStandIn`)."""
    return EmptyStandIn(marker) if content == "" else marker


#: One recorded question: (message index, question, its arguments, the answer to expect).
Check = tuple[int, Callable[..., Any], tuple[Any, ...], Any]
#: Distinct questions a traced rendering may record (a base plus a share per message): real
#: templates ask a few per message; a shape asking more is rendered instead, which bounds a
#: skeleton's memory and the cost of checking a conversation against it.
MAX_CHECKS_BASE = 64
MAX_CHECKS_PER_MESSAGE = 16


class NotTraceable(Exception):
    """The template did something with a content that a trace cannot follow."""


def _keeps_strip(s: str, *chars: Any) -> bool:
    return s.strip(*chars) == s


def _keeps_lstrip(s: str, *chars: Any) -> bool:
    return s.lstrip(*chars) == s


def _keeps_rstrip(s: str, *chars: Any) -> bool:
    return s.rstrip(*chars) == s


#: Content methods a trace follows: questions, and strips that must leave the content as is.
_QUESTIONS: dict[str, Callable[..., Any]] = {
    "startswith": str.startswith,
    "endswith": str.endswith,
}
_STRIPS: dict[str, Callable[..., bool]] = {
    "strip": _keeps_strip,
    "lstrip": _keeps_lstrip,
    "rstrip": _keeps_rstrip,
}
_PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """Whether ``value`` may be an argument of a recorded question (no content in it)."""
    kind = type(value)
    if kind is tuple:
        return all(_plain(v) for v in value)
    return kind in _PLAIN


class _Trace:
    """What one traced rendering recorded: its checks, and the texts it wrote for contents."""

    def __init__(self, markers: Sequence[str], messages: int) -> None:
        self.markers = markers  # what each slot's questions are answered as
        self.checks: dict[Check, None] = {}  # each question once, in the order first asked
        self.limit = MAX_CHECKS_BASE + MAX_CHECKS_PER_MESSAGE * messages
        self.written: dict[int, str] = {}  # id -> text: kept alive, so ids stay unique
        self.tools = 2 * messages  # the first tool slot: only tool texts may be escaped
        self.escaped: set[int] = set()  # slots written inside tojson

    def ask(self, i: int, question: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """The answer of content ``i``'s marker to ``question(content, *args)``, recorded (an
        empty content's marker answers as the empty string)."""
        if not all(_plain(a) for a in args):
            raise NotTraceable("a content compared with another content")
        standing = self.markers[i]
        try:
            answer = question("" if type(standing) is EmptyStandIn else standing, *args)
        except Exception as exc:
            raise NotTraceable(f"a question a content cannot answer: {exc}") from None
        if type(answer) is not bool:
            raise NotTraceable("a question whose answer is not true or false")
        self.checks[(i, question, args, answer)] = None
        if len(self.checks) > self.limit:
            raise NotTraceable(f"more than {self.limit} distinct questions asked of contents")
        return answer

    def strip(self, value: Opaque, keeps: Callable[..., bool], args: tuple[Any, ...]) -> Opaque:
        """``value`` stripped: itself, recorded as "stripping keeps it" (which must hold for
        the marker)."""
        if not self.ask(value.index, keeps, args):
            raise NotTraceable("a strip that changes the marker")
        return value

    def write(self, text: str) -> str:
        self.written[id(text)] = text
        return text


class Opaque:
    """A content in a traced rendering (see the module docstring)."""

    __slots__ = ("index", "trace")
    __hash__ = None  # type: ignore[assignment]  # a hash would read the content

    def __init__(self, index: int, trace: _Trace) -> None:
        self.index = index
        self.trace = trace

    def __eq__(self, other: object) -> bool:
        return bool(self.trace.ask(self.index, operator.eq, (other,)))

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __bool__(self) -> bool:
        return bool(self.trace.ask(self.index, operator.truth, ()))

    def __contains__(self, item: object) -> bool:
        return bool(self.trace.ask(self.index, operator.contains, (item,)))

    def __add__(self, other: object) -> Joined:
        return Joined.of(self, other)

    def __radd__(self, other: object) -> Joined:
        return Joined.of(other, self)

    def __str__(self) -> str:
        raise NotTraceable("a content turned into text other than by writing it out")

    __repr__ = __format__ = __str__  # type: ignore[assignment]

    def text(self) -> str:
        return marker(self.index)  # a new string each time: its identity is checked later


class Joined:
    """Text and contents joined by ``+`` (written out as the texts and markers)."""

    __slots__ = ("parts",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, parts: tuple[str | Opaque | Escaped, ...]) -> None:
        self.parts = parts

    @staticmethod
    def of(left: object, right: object) -> Joined:
        return Joined((*_parts(left), *_parts(right)))

    def __add__(self, other: object) -> Joined:
        return Joined.of(self, other)

    def __radd__(self, other: object) -> Joined:
        return Joined.of(other, self)

    def _refuse(self, *_: object) -> Any:
        raise NotTraceable("text joined with a content used other than by writing it out")

    __str__ = __repr__ = __format__ = __bool__ = __eq__ = __ne__ = __contains__ = _refuse  # type: ignore[assignment]

    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text() for p in self.parts)


class Escaped:
    """A tool text written inside ``tojson``: its marker, JSON-escaped when filled."""

    __slots__ = ("index", "trace")

    def __init__(self, value: Opaque) -> None:
        self.index = value.index
        self.trace = value.trace

    def text(self) -> str:
        return marker(self.index)


def _parts(value: object) -> tuple[str | Opaque | Escaped, ...]:
    if isinstance(value, Opaque):
        return (value,)
    if isinstance(value, Joined):
        return value.parts
    if type(value) is str and MARKER not in value:
        return (value,)
    raise NotTraceable("a content joined with something other than text (or a marker in it)")


def _finalize(value: Any) -> Any:
    """What ``{{ value }}`` writes: a content's marker (recorded as written), else the value;
    a plain text holding a marker went through a block or a macro, which a trace cannot
    follow."""
    kind = type(value)
    if kind is Opaque or kind is Joined:
        trace = value.trace if kind is Opaque else _trace_of(value)
        if kind is Joined:
            trace.escaped.update(p.index for p in value.parts if type(p) is Escaped)
        return trace.write(value.text())
    if kind is str and MARKER in value:
        raise NotTraceable("a content written out through a block or a macro")
    return value


def _trace_of(joined: Joined) -> _Trace:
    return next(p.trace for p in joined.parts if not isinstance(p, str))


def _contents(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(type(v) in (Opaque, Joined) for v in (*args, *kwargs.values()))


def _traced_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that refuses contents, but ``trim`` (a strip that must keep the content)."""

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        if not _contents(args, kwargs):
            return fn(*args, **kwargs)
        value = args[0] if args else None
        if name == "trim" and type(value) is Opaque and not kwargs and _plain(args[1:]):
            return value.trace.strip(value, _keeps_strip, args[1:])
        raise NotTraceable(f"a content passed to the filter {name!r}")

    return traced


#: A marker in a text (its slot's number between the marker and ``\ue002``).
MARKED = re.compile(re.escape(MARKER) + "[0-9]+\ue002")


def slot_of(marked: str) -> int:
    """The slot of a marker (a match of :data:`MARKED`)."""
    return int(marked[len(MARKER) : -1])


#: A marker in any case (a template may change a text's case), or escaped by
#: ``tojson(ensure_ascii=True)``; the slot's number in group 1 or 2.
_WRITTEN = re.compile(
    "(?:"
    + re.escape(MARKER)
    + "([0-9]+)\ue002|"
    + re.escape(json.dumps(MARKER)[1:-1])
    + "([0-9]+)"
    + re.escape("\\ue002")
    + ")",
    re.IGNORECASE,
)


def written_slots(text: str) -> set[int]:
    """The slots whose markers ``text`` holds, as they are, in another case or escaped to
    ASCII: the texts a template writes, whether or not a layout can place them."""
    return {int(m.group(1) or m.group(2)) for m in _WRITTEN.finditer(text)}


def _traced_tojson(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``tojson`` of a value holding tool texts (:class:`Opaque`, anywhere inside it): the JSON
    with each tool text's marker where its escaped text goes (:class:`Escaped`). Contents and
    reasoning inside it are not followed (their ranges must be verbatim), nor are markers that
    the options escape (``ensure_ascii``)."""

    @functools.wraps(fn)
    def traced(value: Any, *args: Any, **kwargs: Any) -> Any:
        found: dict[str, Opaque] = {}
        text = fn(_marked(value, found), *args, **kwargs)
        if not found:
            return text
        if any(o.index < o.trace.tools for o in found.values()):
            raise NotTraceable("a content or reasoning written inside tojson")
        pieces = MARKED.split(text)
        markers = MARKED.findall(text)
        if sorted(markers) != sorted(found):
            raise NotTraceable("tojson escaped a marker, or wrote one twice")
        parts: list[str | Escaped] = [pieces[0]]
        for mark, piece in zip(markers, pieces[1:]):
            parts += (Escaped(found[mark]), piece)
        return Joined(tuple(p for p in parts if p != ""))

    return traced


def _marked(value: Any, found: dict[str, Opaque]) -> Any:
    """``value`` with each :class:`Opaque` inside it replaced by its marker (kept in
    ``found``)."""
    kind = type(value)
    if kind is Opaque:
        text = value.text()
        found[text] = value
        return text
    if kind is Joined:
        raise NotTraceable("text joined with a content inside tojson")
    if kind is dict:
        return {k: _marked(v, found) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_marked(v, found) for v in value]
    return value


def _traced_test(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A test whose answer on a content is recorded (a test is a pure question)."""
    passes = getattr(fn, "jinja_pass_arg", None) is not None

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        if not _contents(args, kwargs):
            return fn(*args, **kwargs)
        value = args[0]
        if passes or kwargs or type(value) is not Opaque:
            raise NotTraceable("a content in a test a trace cannot ask")
        return value.trace.ask(value.index, fn, args[1:])

    return traced


@functools.cache
def _environment_class() -> type:
    base = environment_class()

    class TraceEnvironment(base):  # type: ignore[valid-type,misc]
        """The chat environment, following contents (:class:`Opaque`) instead of reading them."""

        def getattr(self, obj: Any, attribute: str) -> Any:
            kind = type(obj)
            if kind is Opaque:
                if attribute in _QUESTIONS:
                    question = _QUESTIONS[attribute]
                    return lambda *args: obj.trace.ask(obj.index, question, args)
                if attribute in _STRIPS:
                    keeps = _STRIPS[attribute]
                    return lambda *args: obj.trace.strip(obj, keeps, args)
                raise NotTraceable(f"content.{attribute}")
            if kind is Joined:
                raise NotTraceable(f"(text + content).{attribute}")
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            if type(obj) in (Opaque, Joined):
                raise NotTraceable("a content indexed or sliced")
            return super().getitem(obj, argument)

    return TraceEnvironment


class Tracer:
    """Traced renderings of one chat template, compiled once in the tracing environment."""

    def __init__(self, template: ChatTemplate) -> None:
        self._lock = threading.Lock()
        self._template = template
        self._compiled: tuple[Any, dict[str, Any]] | None = None
        self._traceable: bool | None = None  # None: not compiled yet

    def _compile(self) -> tuple[Any, dict[str, Any]] | None:
        """The template in the tracing environment; None when it is not traceable (it
        captures output, or holds a marker)."""
        with self._lock:
            if self._traceable is None:
                env = _environment_class()(finalize=_finalize)
                env.filters = {
                    name: fn if " " in name else _traced_filter(name, fn)  # budget filters
                    for name, fn in env.filters.items()
                }
                env.tests = {name: _traced_test(fn) for name, fn in env.tests.items()}
                text = self._template.source.text
                self._traceable = MARKER not in text and _no_capture(env, text)
                if self._traceable:
                    self._compiled = self._template.compile(env)  # sets the chat tojson
                    env.filters["tojson"] = _traced_tojson(env.filters["tojson"])
            return self._compiled

    def checks(
        self,
        messages: Sequence[dict[str, Any]],
        probe: str,
        field: str | None = None,
        slots: Sequence[int] = (),
        tools: list[Any] | None = None,
    ) -> Traced | None:
        """The questions the template asks of ``messages``' slots (:mod:`.chat_slots`: the
        contents, the ``field`` of the messages ``slots``, each tool text), and the tool texts
        it writes inside ``tojson``, when a traced rendering of their shape writes exactly
        ``probe`` (the rendering with every slot replaced by its marker); None when the
        template does what a trace cannot follow. ``tools``: the tool definitions the
        rendering sees (:meth:`.ChatTemplate.with_tools`)."""
        compiled = self._compile()
        if compiled is None:
            return None
        template, scope = compiled
        n = len(messages)
        markers = [stand_in(marker(i), m["content"]) for i, m in enumerate(messages)]
        texts = len(tool_texts(messages))
        if slots or texts:
            markers += [marker(n + j) if j in slots else "" for j in range(n)]
            markers += [marker(slot) for slot in range(2 * n, 2 * n + texts)]
        trace = _Trace(markers, n)
        opened = [{**m, "content": Opaque(i, trace)} for i, m in enumerate(messages)]
        traced = with_slots(opened, field, slots, lambda slot: Opaque(slot, trace))
        scope = scope.copy()
        scope["messages"] = traced
        scope["tools"] = tools
        scope[chat_budget.BUDGET_KEY] = chat_budget.RenderBudget(traced, tools)
        pieces, size = [], 0
        try:
            for piece in template.root_render_func(template.new_context(scope, shared=True)):
                if MARKER in piece and trace.written.get(id(piece)) is not piece:
                    return None  # a marker written other than by {{ }} at the top level
                pieces.append(piece)
                size += len(piece)
                if size > len(probe):
                    return None
        except Exception:  # NotTraceable, or the template fails on markers: not traceable
            return None
        if "".join(pieces) != probe:
            return None
        return Traced(tuple(trace.checks), frozenset(trace.escaped))


class Traced(NamedTuple):
    """What a traced rendering learned of a shape: the questions asked of its slots, and the
    tool texts written inside ``tojson``."""

    checks: tuple[Check, ...]
    escaped: frozenset[int]


def _no_capture(env: Any, text: str) -> bool:
    """Whether the template writes everything it outputs straight to the rendering: no macro,
    ``{% call %}``, ``{% filter %}`` block or ``{% set %}`` block, whose captured output a
    template can transform as text (``{% filter trim %}`` keeps the very string ``finalize``
    returned, so the identity check alone would not see it)."""
    from jinja2 import nodes

    ast = env.parse(text)
    captures = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock)
    return not any(True for _ in ast.find_all(captures))


def holds(checks: Sequence[Check], contents: Sequence[str | None]) -> bool:
    """Whether ``contents`` (by slot: the contents, then the reasoning of messages with one)
    give every recorded answer."""
    try:
        return all(question(contents[i], *args) == answer for i, question, args, answer in checks)
    except Exception:
        return False
