"""Messages written in another convention, renamed to the chat template's ``{role, content}``.

Much chat data is not in the OpenAI / Hugging Face convention: ShareGPT writes a message as
``{"from": "human", "value": "..."}`` (roles ``system``, ``human``, ``gpt``), and others use
their own keys and role names. ``render_chat``'s ``role_key``, ``content_key`` and
``role_names`` say how a corpus writes them; :func:`renamed` gives each message the ``role``
and ``content`` keys the templates read (every other key kept as it is), its role mapped by
``role_names`` (a role not named there is kept). Nothing is guessed: a message without the
configured role or content key (the content may be missing beside ``tool_calls``) is a
``chat_error`` naming the key and the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .chat_layout import ChatError
from .errors import ConfigError


class Keys:
    """How a corpus writes a message's role and content (defaults: ``role``, ``content``)."""

    def __init__(
        self, role_key: str, content_key: str, role_names: Mapping[str, str] | None
    ) -> None:
        for name, value in (("role_key", role_key), ("content_key", content_key)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"render_chat: {name} must be a non-empty string, got {value!r}")
        if role_key == content_key:
            raise ConfigError(
                f"render_chat: role_key and content_key must differ, both are {role_key!r}"
            )
        names = {} if role_names is None else role_names
        if not isinstance(names, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in names.items()
        ):
            raise ConfigError(
                "render_chat: role_names must map the corpus's role names to the template's, "
                f"e.g. {{human: user, gpt: assistant}}, got {role_names!r}"
            )
        self.role_key, self.content_key, self.role_names = role_key, content_key, dict(names)
        #: Whether messages need renaming at all (the OpenAI convention does not).
        self.active = (role_key, content_key) != ("role", "content") or bool(names)

    def params(self) -> dict[str, Any]:
        return {
            "role_key": self.role_key,
            "content_key": self.content_key,
            "role_names": self.role_names,
        }


def renamed(value: Any, field: str, keys: Keys) -> Any:
    """``value``, a record's list of messages, with each message's role and content under the
    keys templates read (module docstring); what is not a list of objects is returned as it is,
    for :func:`.chat_layout.check_messages` to name. Raises :class:`.chat_layout.ChatError`
    for a message without ``keys.role_key`` or ``keys.content_key``."""
    if not keys.active or not isinstance(value, list):
        return value
    role_key, content_key, names = keys.role_key, keys.content_key, keys.role_names
    out: list[Any] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            out.append(message)
            continue
        for key, option in ((role_key, "role_key"), (content_key, "content_key")):
            if key not in message and not (key == content_key and message.get("tool_calls")):
                raise ChatError(
                    f"{field}[{i}] has no {key!r} key (render_chat.{option}; its keys: "
                    f"{sorted(message)[:8]})"
                )
        role = message[role_key]
        others = {k: v for k, v in message.items() if k not in (role_key, content_key)}
        out.append(
            {
                **others,
                "role": names.get(role, role) if isinstance(role, str) else role,
                "content": message.get(content_key),
            }
        )
    return out
