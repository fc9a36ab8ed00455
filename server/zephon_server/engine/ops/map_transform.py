"""``map_transform``: apply a user function to each payload.

The function takes a payload dict and returns a new payload dict, or ``None`` to drop the
record (it is replaced by a tombstone with reason ``filtered``, so the document stays
accounted for). It must be deterministic and stateless. In YAML, give it as
``"package.module:function"``; in Python, any importable callable (the processes runner
pickles it by reference).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from .base import Operator, OpTraits


def resolve_callable(fn: Callable[..., Any] | str, *, what: str) -> Callable[..., Any]:
    """A callable from itself or from a ``"module:attribute"`` reference."""
    if callable(fn):
        return fn
    if not isinstance(fn, str) or ":" not in fn:
        raise ConfigError(f"{what}: expected a callable or 'module:function', got {fn!r}")
    module_name, _, attr = fn.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{what}: cannot import {fn!r} ({exc}); check the module path and that it is importable"
        ) from exc
    if not callable(target):
        raise ConfigError(f"{what}: {fn!r} is not callable")
    return target


def callable_identity(fn: Callable[..., Any]) -> str:
    """A stable identity for the fingerprint: qualified name plus a hash of its source."""
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return name
    return f"{name}@{hashlib.sha256(source.encode()).hexdigest()[:16]}"


class MapTransform(Operator):
    """Applies ``fn(payload) -> payload | None`` to every record."""

    op_name = "map_transform"
    default_microbatch_size = 64

    def traits(self) -> OpTraits:
        # Records leave in input order; count-based grouping: fusable with its neighbours.
        return OpTraits(preserves_cursor_order=True, fusable=True)

    def __init__(self, *, fn: Callable[..., Any] | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fn = resolve_callable(fn, what="map_transform.fn")

    def params(self) -> dict[str, Any]:
        return {"fn": callable_identity(self.fn)}

    def process_many(self, elems: list[Any]) -> list[Any]:
        out = []
        fn = self.fn
        for rec in elems:
            payload = fn(rec.payload)
            if payload is None:
                out.append(rec.tombstone("filtered"))
            elif not isinstance(payload, dict):
                raise TypeError(
                    f"map_transform: {callable_identity(fn)} returned {type(payload).__name__}; "
                    "return a payload dict, or None to drop the record"
                )
            else:
                out.append(rec.with_payload(payload))
        return out
