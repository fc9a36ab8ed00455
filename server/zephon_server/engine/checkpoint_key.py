"""The secret that signs checkpoints (HMAC-SHA256), so a forged one is refused.

A checkpoint's sha256 protects it against damage, not against someone who edits the payload
and recomputes the checksum. A server given a key (``--checkpoint-key-file`` or the
``ZEPHON_CHECKPOINT_KEY`` environment variable, read by the command line only) signs every
checkpoint it writes and refuses any it reads that is unsigned or signed with another key.

The key is the file's (or variable's) text with surrounding whitespace removed, at least
:data:`MIN_BYTES` bytes, so ``openssl rand -hex 32 > key`` makes a good one. It never appears
in a repr or a log line; ``source`` says where it came from for messages.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field

from .errors import ConfigError
from .user_files import read_user_file

MIN_BYTES = 16
"""The shortest key accepted (128 bits)."""
MAC_BYTES = 32
"""HMAC-SHA256 length: what a signature adds to a checkpoint."""


@dataclass(frozen=True)
class CheckpointKey:
    """An HMAC-SHA256 key for checkpoints; ``source`` names its origin in messages."""

    secret: bytes = field(repr=False)
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes):
            raise ConfigError(
                f"checkpoint key from {self.source}: expected bytes, got {type(self.secret)}"
            )
        if len(self.secret) < MIN_BYTES:
            raise ConfigError(
                f"checkpoint key from {self.source} is {len(self.secret)} bytes; use at least "
                f"{MIN_BYTES} (e.g. openssl rand -hex 32 > checkpoint.key)"
            )

    @classmethod
    def from_text(cls, text: str | bytes, source: str) -> CheckpointKey:
        """The key ``text`` holds (surrounding whitespace removed)."""
        raw = text.encode() if isinstance(text, str) else text
        return cls(raw.strip(), source)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CheckpointKey:
        """The key in file ``path``; :class:`ConfigError` naming the file when it cannot be."""
        source = f"--checkpoint-key-file {str(path)!r}"
        data = read_user_file("--checkpoint-key-file", path, "a key file")
        return cls.from_text(data, source)

    def sign(self, data: bytes) -> bytes:
        """The MAC of ``data`` (:data:`MAC_BYTES` bytes)."""
        return hmac.new(self.secret, data, hashlib.sha256).digest()

    def verify(self, data: bytes, mac: bytes) -> bool:
        """Whether ``mac`` is this key's MAC of ``data`` (constant-time comparison)."""
        return hmac.compare_digest(self.sign(data), mac)
