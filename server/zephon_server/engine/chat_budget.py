"""Chat-template render budget: a hostile template fails closed instead of hanging.

A chat template is code from a tokenizer directory or a pipeline file, and Jinja's sandbox
only stops it reaching Python objects: ``{% for i in range(100000) %}{% for j in
range(100000) %}...`` or a macro calling itself twice per call would render forever, and a
template can write gigabytes. Every render therefore gets a :class:`RenderBudget` sized by its
conversation, and the template is rewritten once, before it is compiled (:func:`instrument`):

* every ``{% for %}`` iterates ``iterable|<count>``, which charges one *step* per element: a
  list, tuple, dict or string the remaining budget covers is charged whole when the loop
  starts (no per-element cost on the hot path); anything else (a ``range``, a filter's
  generator, a list larger than what is left) through a generator that charges each element
  it hands out, so a loop that breaks early pays only for what it ran. Elements a loop's
  ``if`` filters out count, and so do nested loops, loops without ``loop`` and the whole
  iterable ``loop.length`` materialises. A recursive loop (``loop(children)``) charges one
  step per element through its ``if`` test instead, because the iterables it recurses into
  never pass through ``iter``;
* every macro body and ``{% call %}`` body charges one step when it starts and tracks its
  nesting depth (entered at the top, left at the bottom: a template cannot catch an exception,
  so the two stay balanced for the rest of a render), bounded by :data:`MAX_CALL_DEPTH`;
* the caller bounds the output (:data:`OUTPUT_BASE` + :data:`OUTPUT_PER_CHAR` characters per
  character of the conversation), counting as the render generator yields;
* ``*`` and ``**`` go through the environment (:func:`bounded_binop`): a repeated sequence or
  a power may not outgrow the output budget or :data:`MAX_INT_BITS` (they are not folded at
  compile time either, so ``2 ** 1000000000000`` cannot hang the compiler);
* no value may outgrow the output budget either, however it is made (``+`` on strings or
  lists, ``~``, ``%`` and ``format`` widths, ``center``/``ljust``/``replace``/``join`` and the
  filters that pad, indent or join): a template that doubles a list in a loop of 30 steps
  needs no output to fill memory. Where an operation's result size follows from its inputs it
  is checked before it runs (:func:`grown_size`); every result is measured after it. Values
  under :data:`OUTPUT_BASE` characters, all a real template makes, pass on one comparison.

The counting helpers are filters whose names no template can write (they contain a space), so
a template can neither call nor shadow them; they are called directly by the compiled code
(filters skip the sandbox's per-call checks) and find the render's budget in the render's
context. The rewrite changes what a template may do, never what it writes: outputs are
byte-identical. Budgets are generous for real templates (linear in the conversation); see
docs/decisions.md ("Chat-template render budget") for the figures and the remaining limits.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

logger = logging.getLogger(__name__)

#: Steps (loop iterations + macro calls) per render: a base plus a share per message.
STEPS_BASE = 10_000
STEPS_PER_MESSAGE = 1_000
#: Characters of output per render: a base plus a multiple of the conversation's characters.
OUTPUT_BASE = 1 << 20
OUTPUT_PER_CHAR = 16
#: Pieces of output (one per output expression or text run) measured at once, at the start of
#: a render; later ones are measured one by one.
OUTPUT_CHUNKS = 64
#: Deepest nesting of macro (and ``{% call %}``) bodies.
MAX_CALL_DEPTH = 64
#: Largest integer ``*`` or ``**`` may produce, in bits.
MAX_INT_BITS = 1 << 16
#: Where a render's budget sits in its Jinja context (not a name a template can write).
BUDGET_KEY = "zephon render budget"
#: Iterables a loop is charged for in full when it starts, if the budget has room for them all
#: (else element by element, so that only iterations actually run can exhaust the budget).
_SIZED = frozenset([list, tuple, dict, str])
_COUNT, _STEP, _ENTER, _LEAVE, _JOIN = (
    "zephon count",
    "zephon step",
    "zephon enter",
    "zephon leave",
    "zephon join",
)
FIX = "the template is the problem: fix it, or give render_chat: {template: PATH} a template file"


class BudgetExceeded(Exception):
    """A render went over its budget; the message names the budget and the fix."""


class RenderBudget:
    """What one render may still spend. Mutable on purpose: it is a per-render counter,
    created for each render (by :meth:`ChatTemplate.render`) and dropped when it ends."""

    __slots__ = ("_messages", "_output_limit", "_tools", "depth", "steps")

    def __init__(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> None:
        self._messages = messages
        self._tools = tools or ()  # the record's tool definitions: each a message's share
        self.steps = self.step_limit
        self.depth = 0
        self._output_limit = 0

    @property
    def step_limit(self) -> int:
        """Steps (loop iterations and macro calls) the render may take."""
        return STEPS_BASE + STEPS_PER_MESSAGE * (len(self._messages) + len(self._tools))

    def output_limit(self) -> int:
        """Characters the render may write: :data:`OUTPUT_BASE` + :data:`OUTPUT_PER_CHAR` per
        character of the messages' top-level string fields (``content``,
        ``reasoning_content``, ``role``, ...) and of the tool definitions as JSON. Computed
        on first use: a render that stays under :data:`OUTPUT_BASE` never needs it, and the
        hot path skips the count."""
        if not self._output_limit:
            chars = len(json.dumps(self._tools, default=repr)) if self._tools else 0
            for message in self._messages:
                if isinstance(message, Mapping):
                    chars += sum(len(v) for v in message.values() if type(v) is str)
            self._output_limit = OUTPUT_BASE + OUTPUT_PER_CHAR * chars
        return self._output_limit

    def iterate(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """``iterable``'s elements, one step each."""
        for item in iterable:
            self.steps -= 1
            if self.steps < 0:
                raise self.steps_exceeded()
            yield item

    def step(self) -> None:
        """Charge one step."""
        self.steps -= 1
        if self.steps < 0:
            raise self.steps_exceeded()

    def steps_exceeded(self) -> BudgetExceeded:
        return BudgetExceeded(
            f"the chat template went over its render budget of {self.step_limit} loop "
            f"iterations and macro calls ({STEPS_BASE} + {STEPS_PER_MESSAGE} per message, "
            f"{len(self._messages)} messages); {FIX}"
        )

    def output_exceeded(self, size: int) -> BudgetExceeded:
        return BudgetExceeded(
            f"the chat template went over its output budget of {self.output_limit()} characters "
            f"({OUTPUT_BASE} + {OUTPUT_PER_CHAR} per character of the conversation; it wrote "
            f"{size}); {FIX}"
        )

    def collect(self, chunks: Iterator[str]) -> str:
        """The text of a render generator, measured against the output budget: the first
        :data:`OUTPUT_CHUNKS` pieces at once (joined at C speed: most renders are that
        short), then piece by piece; raises :class:`BudgetExceeded` once it is over budget."""
        text = "".join(islice(chunks, OUTPUT_CHUNKS))
        following = next(chunks, None)  # a render yields only strings: None is its end
        if following is None and len(text) <= OUTPUT_BASE:
            return text  # the common case: short, under the budget's floor
        pieces, size, limit = [text], len(text), OUTPUT_BASE
        if following is not None:
            pieces.append(following)
            size += len(following)
        if size > limit:
            limit = self._check_output(size)
        if following is not None:
            for piece in chunks:
                pieces.append(piece)
                size += len(piece)
                if size > limit:
                    limit = self._check_output(size)
        return "".join(pieces)

    def _check_output(self, size: int) -> int:
        """The full output limit, once ``size`` passed the floor; raises when over it."""
        limit = self.output_limit()
        if size > limit:
            raise self.output_exceeded(size)
        return limit

    def enter(self) -> None:
        """A macro body starts: one step, one level deeper."""
        self.step()
        self.depth += 1
        if self.depth > MAX_CALL_DEPTH:
            raise BudgetExceeded(
                f"the chat template went over its call depth budget: macros nested more than "
                f"{MAX_CALL_DEPTH} deep (a macro that calls itself without end?); {FIX}"
            )


def _budget(context: Any) -> RenderBudget:
    budget: RenderBudget = context.parent[BUDGET_KEY]
    return budget


def _filters() -> dict[str, Any]:
    """The counting filters, by their unwritable names (they take the render's context)."""
    from jinja2 import pass_context

    @pass_context
    def count(context: Any, iterable: Any, sized: frozenset[type] = _SIZED) -> Any:
        budget: RenderBudget = context.parent[BUDGET_KEY]
        if type(iterable) in sized:
            left = budget.steps - len(iterable)
            if left >= 0:  # charged whole: the loop runs as fast as without the budget
                budget.steps = left
                return iterable
        return budget.iterate(iterable)

    @pass_context
    def step(context: Any, value: Any) -> Any:
        _budget(context).step()
        return value

    @pass_context
    def enter(context: Any, value: Any) -> Any:
        _budget(context).enter()
        return value

    @pass_context
    def leave(context: Any, value: Any) -> Any:
        _budget(context).depth -= 1
        return value

    @pass_context
    def join(context: Any, items: list[Any]) -> Any:
        from jinja2.runtime import markup_join, str_join

        joined = markup_join(items) if context.eval_ctx.autoescape else str_join(items)
        return checked(context, joined, "joins values with '~' into a text")

    return {_COUNT: count, _STEP: step, _ENTER: enter, _LEAVE: leave, _JOIN: join}


def bounded_filters(filters: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`GROWING_FILTERS` of ``filters``, each checking its result's size (before
    it runs where its arguments tell, :func:`grown_size`; after it always)."""
    import functools

    from jinja2.utils import _PassArg

    def bounded(name: str, func: Any) -> Any:
        kind = _PassArg.from_obj(func)
        what = f"makes with {name!r} a value"

        @functools.wraps(func)
        def run(context: Any, *args: Any, **kwargs: Any) -> Any:
            check_size(context, grown_size(name, args[0], args[1:], kwargs), what)
            if kind is _PassArg.context:
                result = func(context, *args, **kwargs)
            elif kind is _PassArg.eval_context:
                result = func(context.eval_ctx, *args, **kwargs)
            elif kind is _PassArg.environment:
                result = func(context.environment, *args, **kwargs)
            else:
                result = func(*args, **kwargs)
            return checked(context, result, what)

        run.jinja_pass_arg = _PassArg.context  # type: ignore[attr-defined]
        return run

    return {name: bounded(name, filters[name]) for name in GROWING_FILTERS if name in filters}


def _call(arg: Any, name: str, lineno: int) -> Any:
    from jinja2 import nodes

    return nodes.Filter(arg, name, [], [], None, None, lineno=lineno)


def instrument(env: Any, ast: Any) -> Any:
    """Install the counting filters in ``env`` and rewrite the parsed template ``ast`` (a
    ``jinja2.nodes.Template``, changed in place and returned) so that every loop iteration and
    macro call is charged to the render's budget."""
    from jinja2 import nodes

    env.filters.update(_filters())
    env.filters.update(bounded_filters(env.filters))
    for concat in list(ast.find_all(nodes.Concat)):  # ``a ~ b``: joined by a checking filter
        joined = _call(nodes.List(concat.nodes, lineno=concat.lineno), _JOIN, concat.lineno)
        concat.nodes = [joined]
    for loop in list(ast.find_all(nodes.For)):
        if loop.recursive:
            tick = _call(nodes.Const(True), _STEP, loop.lineno)
            loop.test = tick if loop.test is None else nodes.And(tick, loop.test)
        else:
            loop.iter = _call(loop.iter, _COUNT, loop.lineno)
    for body in [*ast.find_all(nodes.Macro), *ast.find_all(nodes.CallBlock)]:
        enter = nodes.ExprStmt(_call(nodes.Const(None), _ENTER, body.lineno))
        leave = nodes.ExprStmt(_call(nodes.Const(None), _LEAVE, body.lineno))
        body.body = [enter, *body.body, leave]
    ast.set_environment(env)
    return ast


#: The binary operators :func:`bounded_binop` checks.
BOUNDED_BINOPS = frozenset(["*", "**", "+", "%"])
_SEQUENCES = (str, list, tuple)
#: Filters whose result may be far larger than their input (widths, separators, indents).
#: (``tojson``'s ``indent`` is bounded by the chat ``tojson`` itself: :data:`MAX_JSON_INDENT`.)
GROWING_FILTERS = ("center", "indent", "format", "replace", "join", "wordwrap")
#: ``str`` methods whose result may be far larger than the string (:func:`grown_size`).
GROWING_METHODS = frozenset(
    ["center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "format", "format_map"]
)
#: Largest ``indent`` of the chat ``tojson`` filter (real templates use 2 or 4).
MAX_JSON_INDENT = 64
_WIDE_NUMBER = re.compile(r"\d{7,}")  # a width of a million or more in a format string


def check_size(context: Any, size: int, what: str) -> None:
    """Refuse a value of ``size`` characters (or items) over the render's output budget:
    ``what`` says how the template made it."""
    if size > OUTPUT_BASE:
        limit = _budget(context).output_limit()
        if size > limit:
            raise BudgetExceeded(
                f"the chat template {what} of {size} characters, more than its output budget "
                f"of {limit} characters; {FIX}"
            )


def checked(context: Any, result: Any, what: str) -> Any:
    """``result``, unless it is a string, list or tuple over the output budget."""
    if type(result) in _SEQUENCES:
        check_size(context, len(result), what)
    return result


def grown_size(name: str, value: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """An upper bound of the size of ``value.name(*args)`` (a ``str`` method, or the filter
    of that name applied to ``value``), from its inputs; 0 when it cannot grow much."""
    if not isinstance(value, str):
        if name == "join" and isinstance(value, (list, tuple)):
            sep = args[0] if args and isinstance(args[0], str) else kwargs.get("d", "")
            return _joined(sep, value)
        return 0
    given = (*args, *kwargs.values())
    widths = [a for a in given if type(a) is int]
    pieces = max((len(a) for a in given if isinstance(a, str)), default=0)  # indent/wrapstring
    if name in ("center", "ljust", "rjust", "zfill"):
        return len(value) + max(widths, default=0)
    if name == "indent":  # a width, or a string, before every line
        return len(value) + (value.count("\n") + 1) * max(max(widths, default=0), pieces)
    if name == "wordwrap":  # a wrapstring at most between any two characters
        return len(value) + (len(value) + 1) * pieces
    if name == "expandtabs":
        return len(value) + value.count("\t") * max(widths, default=8)
    if name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        old, new = args[0], args[1]
        found = value.count(old) if old else len(value) + 1
        return len(value) + found * max(0, len(new) - len(old))
    if name == "join":
        return _joined(value, args[0]) if args and isinstance(args[0], (list, tuple)) else 0
    if name in ("format", "format_map"):
        return max((int(w) for w in _WIDE_NUMBER.findall(value)), default=0)
    return 0


def _joined(sep: str, items: Sequence[Any]) -> int:
    return len(sep) * max(0, len(items) - 1) + sum(len(x) for x in items if isinstance(x, str))


def bounded_binop(context: Any, operator: str, left: Any, right: Any) -> Any:
    """``left * right``, ``left ** right``, ``left + right`` or ``left % right``, refused
    (:class:`BudgetExceeded`) when the result would be a sequence longer than the output
    budget or an integer over :data:`MAX_INT_BITS` bits: computing it could take all memory
    or never end."""
    if operator == "+":
        if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
            check_size(context, len(left) + len(right), "joins values with '+' into one")
        return left + right
    if operator == "%":
        if isinstance(left, str):
            check_size(context, grown_size("format", left, (), {}), "pads a value with '%' to")
            return checked(context, left % right, "formats with '%' a text")
        return left % right
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                limit = _budget(context).output_limit()
                if len(seq) * times > limit:
                    raise BudgetExceeded(
                        f"the chat template repeats a sequence of {len(seq)} {times} times, "
                        f"more than its output budget of {limit} characters; {FIX}"
                    )
        if isinstance(left, int) and isinstance(right, int):
            _check_bits(left.bit_length() + right.bit_length(), "*")
        return left * right
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        _check_bits(left.bit_length() * right, "**")
    return left**right


def _check_bits(bits: int, operator: str) -> None:
    if bits > MAX_INT_BITS:
        raise BudgetExceeded(
            f"the chat template computes an integer of about {bits} bits with {operator!r}, "
            f"more than its budget of {MAX_INT_BITS} bits; {FIX}"
        )
