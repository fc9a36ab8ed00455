"""Chat templates: the Jinja template that turns a list of messages into one text.

A template comes from a file given in the pipeline (``render_chat: {template: PATH}``), or
from the tokenizer's directory: ``chat_template.jinja`` beside ``tokenizer.json``, else the
``chat_template`` key of ``tokenizer_config.json`` (a string, or a list of
``{name, template}`` of which the one named ``default`` is used). The tokenizer's special
tokens (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``, ...) come from
``tokenizer_config.json`` when there is one.

Rendering follows Hugging Face ``apply_chat_template`` (training mode): a sandboxed,
immutable Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension and a ``{% generation %}`` block that renders its body, a ``tojson`` filter that
keeps non-ASCII characters, the ``raise_exception`` helper, and the special tokens,
``messages`` and ``add_generation_prompt=False`` as variables. One deliberate difference:
``strftime_now`` formats a fixed date (the ``date`` option) instead of the clock, because the
output of a pipeline must not depend on when it runs.
"""

from __future__ import annotations

import copy
import datetime
import functools
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import chat_budget
from .errors import ConfigError

logger = logging.getLogger(__name__)

#: Special-token keys of tokenizer_config.json passed to the template (as Hugging Face does).
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
)
#: Largest template or tokenizer_config.json read, in bytes.
MAX_TEMPLATE_BYTES = 1 << 20
MAX_CONFIG_BYTES = 64 << 20


class ChatTemplateError(Exception):
    """A template failed on one conversation (its own ``raise_exception`` or a Jinja error)."""


def _token_text(value: Any) -> Any:
    """A special token as text: tokenizer configs write either a string or an AddedToken dict."""
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    if isinstance(value, list):
        return [_token_text(v) for v in value]
    return value


def _read_text(path: Path, limit: int, what: str) -> str:
    try:
        size = path.stat().st_size
        if size > limit:
            raise ConfigError(f"{what} {str(path)!r} is {size} bytes, more than {limit}")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc}") from exc


def _template_from_config(config: Mapping[str, Any], where: str) -> tuple[str | None, str | None]:
    """The ``chat_template`` of a tokenizer config: a string, or the list form's "default",
    and the list form's "tool_use" (which Hugging Face renders records with tools by)."""
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value, None
    if isinstance(value, list):
        named = {
            t.get("name"): t.get("template") for t in value if isinstance(t, dict) and "name" in t
        }
        if isinstance(named.get("default"), str):
            tool_use = named.get("tool_use")
            return str(named["default"]), tool_use if isinstance(tool_use, str) else None
        raise ConfigError(
            f"{where}: chat_template is a list without a template named 'default' (names: "
            f"{sorted(str(n) for n in named)}); give render_chat a template file"
        )
    raise ConfigError(f"{where}: chat_template must be a string or a list, got {value!r}")


@dataclass(frozen=True)
class TemplateSource:
    """Where a template and its special tokens came from (validated at construction)."""

    text: str
    origin: str
    special_tokens: Mapping[str, Any] = field(default_factory=dict)
    #: The tokenizer config's template named "tool_use", for records with tool definitions.
    tool_use: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise ConfigError(f"chat template from {self.origin}: empty template")

    @property
    def identity(self) -> str:
        """sha256 of the template text(s) and the special tokens (enters the fingerprint)."""
        parts: list[Any] = [self.text, dict(self.special_tokens)]
        if self.tool_use is not None:
            parts.append(self.tool_use)
        doc = json.dumps(parts, sort_keys=True)
        return "sha256:" + hashlib.sha256(doc.encode()).hexdigest()


def find_template(tokenizer_path: str, template_path: str | None) -> TemplateSource:
    """The template for ``render_chat`` (see the module docstring for the search order)."""
    directory = Path(tokenizer_path).parent if tokenizer_path != "byte" else None
    config: dict[str, Any] = {}
    config_file = directory / "tokenizer_config.json" if directory else None
    if config_file is not None and config_file.is_file():
        try:
            loaded = json.loads(_read_text(config_file, MAX_CONFIG_BYTES, "tokenizer config"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"tokenizer config {str(config_file)!r}: bad JSON ({exc})") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"tokenizer config {str(config_file)!r}: not a JSON object")
        config = loaded
    tokens = {k: _token_text(config[k]) for k in SPECIAL_TOKEN_KEYS if config.get(k) is not None}
    if template_path is not None:
        path = Path(template_path)
        return TemplateSource(
            _read_text(path, MAX_TEMPLATE_BYTES, "chat template"), str(path), tokens
        )
    jinja_file = directory / "chat_template.jinja" if directory else None
    if jinja_file is not None and jinja_file.is_file():
        text = _read_text(jinja_file, MAX_TEMPLATE_BYTES, "chat template")
        return TemplateSource(text, str(jinja_file), tokens)
    found, tool_use = (None, None)
    if config_file is not None:
        found, tool_use = _template_from_config(config, str(config_file))
    if found is None:
        looked = f"{config_file} and {jinja_file}" if config_file else "(no tokenizer directory)"
        raise ConfigError(
            f"render_chat: no chat template for tokenizer {tokenizer_path!r}: looked in "
            f"{looked}; set render_chat.template to a Jinja template file"
        )
    return TemplateSource(found, f"{config_file}:chat_template", tokens, tool_use)


#: What a template may not use: its output would change from one run to the next.
_RANDOM_FILTERS = frozenset(["random"])
_RANDOM_GLOBALS = frozenset(["lipsum"])


def _check_deterministic(ast: Any, origin: str) -> None:
    """Refuse a template that draws random values (``| random``, ``lipsum()``): the same
    pipeline must give the same tokens on every run (:class:`ConfigError` naming the fix)."""
    from jinja2 import nodes

    for node in ast.find_all((nodes.Filter, nodes.Name)):
        name = node.name
        if (type(node) is nodes.Filter and name in _RANDOM_FILTERS) or (
            type(node) is nodes.Name and node.ctx == "load" and name in _RANDOM_GLOBALS
        ):
            raise ConfigError(
                f"chat template from {origin}: line {node.lineno} uses {name!r}, which draws "
                "random values, so the rendered tokens would change from run to run; remove "
                "it from the template (give render_chat.template a copy without it)"
            )


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Sequence[str] | None = None,
    sort_keys: bool = False,
) -> str:
    seps = (str(separators[0]), str(separators[1])) if separators is not None else None
    if indent is not None and not 0 <= int(indent) <= chat_budget.MAX_JSON_INDENT:
        raise chat_budget.BudgetExceeded(
            f"the chat template asks tojson for an indent of {indent}, more than "
            f"{chat_budget.MAX_JSON_INDENT}; {chat_budget.FIX}"
        )
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=seps, sort_keys=sort_keys
    )


def json_string(text: str) -> str:
    """``text`` as the chat ``tojson`` filter writes it inside a value, between its quotes
    (what a skeleton fills in for a tool text its template writes with ``tojson``)."""
    return _tojson(text)[1:-1]


def _generation_extension() -> type:
    """A Jinja extension for ``{% generation %}...{% endgeneration %}``: renders its body
    (Hugging Face uses the block to find assistant tokens; Zephon finds them by rendering)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return GenerationBlock


_DICT_ATTRIBUTES = frozenset(dir(dict))
_SEQUENCES = (str, list, tuple)

#: ``str`` methods templates call (``content.strip()``, ``content.split('</think>')``): pure
#: functions of an immutable value. ``format``/``format_map`` are not here: the sandbox guards
#: those when they are called.
_STR_METHODS = frozenset(
    [
        "startswith",
        "endswith",
        "split",
        "rsplit",
        "splitlines",
        "strip",
        "lstrip",
        "rstrip",
        "lower",
        "upper",
        "title",
        "capitalize",
        "replace",
        "find",
        "rfind",
        "index",
        "rindex",
        "count",
        "join",
        "partition",
        "rpartition",
        "isdigit",
        "isspace",
        "isalpha",
        "isalnum",
        "islower",
        "isupper",
    ]
)
#: Attributes of Jinja's ``loop`` object.
_LOOP_ATTRIBUTES = frozenset(
    [
        "index",
        "index0",
        "revindex",
        "revindex0",
        "first",
        "last",
        "length",
        "previtem",
        "nextitem",
        "depth",
        "depth0",
    ]
)


@functools.cache
def environment_class() -> type:
    """The immutable sandbox with a fast path for reading a key of a plain dict.

    Messages are plain dicts parsed from JSON, and templates read ``message.role`` or
    ``message['content']`` many times per render; the sandbox's general path (an attribute
    lookup that fails, then the item, through its safety checks) dominated rendering. The fast
    path returns ``obj[name]`` exactly where Jinja would: the key exists and, for ``obj.name``,
    ``dict`` has no attribute of that name (a key ``items`` still gives the method). Likewise
    the listed pure ``str`` methods, the ``loop`` object's counters and a ``namespace``'s own
    (public) names are returned directly. Anything else (underscore names, other types, calls,
    ``format``) goes through the sandbox unchanged.
    """
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class ChatEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = chat_budget.BOUNDED_BINOPS

        def __init__(self, **options: Any) -> None:
            from jinja2.ext import loopcontrols

            super().__init__(
                trim_blocks=True,
                lstrip_blocks=True,
                extensions=[loopcontrols, _generation_extension()],
                **options,
            )

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "+" and type(left) is str and type(right) is str:
                if len(left) + len(right) > chat_budget.OUTPUT_BASE:  # else: the common case
                    chat_budget.check_size(context, len(left) + len(right), "joins with '+'")
                return left + right
            return chat_budget.bounded_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            """A sandboxed call whose result may not outgrow the render's output budget
            (a ``str`` method that can grow is checked before it runs, from its arguments)."""
            method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            name = getattr(method, "__name__", None)
            owner = getattr(method, "__self__", None)  # a macro named join has none
            if name in chat_budget.GROWING_METHODS and type(owner) is str:
                size = chat_budget.grown_size(name, owner, args, kwargs)
                chat_budget.check_size(__context, size, f"makes with {name!r} a text")
            result = super().call(__context, __obj, *args, **kwargs)
            if type(result) in _SEQUENCES and len(result) > chat_budget.OUTPUT_BASE:
                chat_budget.check_size(__context, len(result), "makes with a call a value")
            return result

        def getattr(self, obj: Any, attribute: str) -> Any:
            kind = type(obj)
            if kind is dict and attribute not in _DICT_ATTRIBUTES and attribute in obj:
                return obj[attribute]
            if kind is str and attribute in _STR_METHODS:
                return getattr(obj, attribute)
            if (kind is LoopContext and attribute in _LOOP_ATTRIBUTES) or (
                kind is Namespace and type(attribute) is str and not attribute.startswith("_")
            ):
                try:
                    return getattr(obj, attribute)
                except AttributeError:
                    pass
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            if type(obj) is dict and type(argument) is str and argument in obj:
                return obj[argument]
            return super().getitem(obj, argument)

    return ChatEnvironment


#: Variables every render sets itself, and the helpers every template is given, which
#: ``template_kwargs`` may not name.
RESERVED_VARIABLES = (
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "raise_exception",
    "strftime_now",
)


class ChatTemplate:
    """A compiled chat template; :meth:`render` turns messages into text.

    The template is instrumented before it is compiled (:mod:`.chat_budget`): every render has
    a budget of loop iterations, macro calls and output, so a hostile template fails with
    :class:`ChatTemplateError` instead of hanging or filling memory.
    """

    def __init__(
        self,
        source: TemplateSource,
        *,
        date: datetime.date,
        variables: Mapping[str, Any] | None = None,
    ) -> None:
        self.source = source
        self.date = date
        #: Extra template variables (``render_chat.template_kwargs``, as the keyword arguments
        #: of Hugging Face's ``apply_chat_template``), e.g. ``enable_thinking``.
        self.variables = dict(variables or {})
        #: The "tool_use" template, compiled (records with tools render by it, as in HF).
        self._tool_use: ChatTemplate | None = None
        if source.tool_use is not None:
            named = TemplateSource(
                source.tool_use, f"{source.origin} (tool_use)", source.special_tokens
            )
            self._tool_use = ChatTemplate(named, date=date, variables=variables)
        #: The tool definitions every render of this template sees (:meth:`with_tools`).
        self.tools: list[Any] | None = None
        #: The variables the template reads from its scope (set by :meth:`compile`).
        self.reads: frozenset[str] = frozenset()
        #: Values callers derive from the template once (the end of turn of
        #: :mod:`.chat_layout`), shared with the copies :meth:`with_tools` makes.
        self.memo: dict[str, Any] = {}
        self._template, self._scope = self.compile(environment_class()())

    @property
    def reads_tools(self) -> bool:
        """Whether the template reads the tool definitions at all (one that does not would
        leave a record's ``tools`` out without a word)."""
        return "tools" in self.reads

    def unread_variables(self) -> list[str]:
        """The extra variables (``template_kwargs``) that neither this template nor its
        "tool_use" one ever reads: they would change nothing."""
        reads = self.reads | (self._tool_use.reads if self._tool_use is not None else set())
        return [name for name in self.variables if name not in reads]

    def with_tools(self, tools: list[Any] | None) -> ChatTemplate:
        """This template rendering with the tool definitions ``tools`` (a record's ``tools``
        list, as Hugging Face's ``apply_chat_template(tools=...)`` passes them; Qwen3 writes
        them in the system turn); the same compiled template, or the tokenizer config's
        "tool_use" template when it has one and ``tools`` is not None, as HF chooses."""
        if tools is self.tools:
            return self
        if tools is not None and self._tool_use is not None:
            return self._tool_use.with_tools(tools)
        bound = copy.copy(self)
        bound.tools = tools
        bound._scope = {**self._scope, "tools": tools}
        return bound

    def budget(self, messages: Sequence[Mapping[str, Any]]) -> chat_budget.RenderBudget:
        """A render budget for ``messages`` (and this template's tools)."""
        return chat_budget.RenderBudget(messages, self.tools)

    def compile(self, env: Any) -> tuple[Any, dict[str, Any]]:
        """This template compiled in ``env`` (of :func:`environment_class` or a subclass, such as
        :mod:`.chat_trace`'s), and the scope every render starts from."""
        from jinja2 import TemplateSyntaxError
        from jinja2 import meta as jinja2_meta

        env.filters["tojson"] = _tojson
        moment = datetime.datetime(self.date.year, self.date.month, self.date.day)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = moment.strftime
        try:
            ast = env.parse(self.source.text)
            _check_deterministic(ast, self.source.origin)
            self.reads = frozenset(jinja2_meta.find_undeclared_variables(ast))
            template = env.from_string(chat_budget.instrument(env, ast))
        except TemplateSyntaxError as exc:
            raise ConfigError(
                f"chat template from {self.source.origin}: syntax error at line {exc.lineno}: "
                f"{exc.message}"
            ) from exc
        # Everything a render sees but the messages, globals included: rendering into a context
        # built on a copy of this (a "shared" context) skips Jinja's per-call merge of the
        # environment's globals, the largest fixed cost of rendering a short conversation.
        scope: dict[str, Any] = {
            **template.globals,
            **self.source.special_tokens,
            **self.variables,
            "tools": None,
            "documents": None,
            "add_generation_prompt": False,
        }
        return template, scope

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, generation_prompt: bool = False
    ) -> str:
        """The template's text for ``messages`` (training: no generation prompt; with
        ``generation_prompt``, what an inference server writes before the model's reply).

        Raises :class:`ChatTemplateError` for any failure of the template on these messages,
        going over its render budget (:mod:`.chat_budget`) included.
        """
        scope = self._scope.copy()
        scope["messages"] = list(messages)
        if generation_prompt:
            scope["add_generation_prompt"] = True
        budget = scope[chat_budget.BUDGET_KEY] = self.budget(messages)
        template = self._template
        try:
            text = budget.collect(
                template.root_render_func(template.new_context(scope, shared=True))
            )
        except chat_budget.BudgetExceeded as exc:
            raise ChatTemplateError(str(exc)) from exc
        except RecursionError as exc:
            raise ChatTemplateError(
                "the chat template went over its call depth budget: it recursed deeper than "
                f"Python allows; {chat_budget.FIX}"
            ) from exc
        except Exception as exc:  # any failure of the template is this conversation's problem
            problem = str(exc) or type(exc).__name__
            raise ChatTemplateError(f"the chat template failed: {problem}") from exc
        return text
