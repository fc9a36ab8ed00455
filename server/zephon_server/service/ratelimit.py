"""A log that writes at most one line per kind per interval, counting what it held back.

Lines caused by callers (a malformed request, a refused checkpoint) are as frequent as the
callers make them: a client in a retry loop, or a scanner, would otherwise fill the disk and
bury everything else in the log. :class:`RateLimitedLog` writes the first line of a kind,
then at most one per ``interval`` seconds; the next line written says how many were held
back since the previous one (``... (37 more like it in the last 10 s)``). Kinds must be a
bounded set (method names, error classes), never caller-chosen strings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Kind:
    last: float  # when the last line of this kind was written
    held: int = 0  # lines not written since then


class RateLimitedLog:
    """At most one ``logger`` line per kind per ``interval`` seconds (see the module)."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"rate-limited log: interval must be > 0 seconds, got {interval!r}")
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, _Kind] = {}

    def log(self, level: int, kind: str, message: str, *args: object) -> bool:
        """Write ``message % args`` at ``level`` unless a line of ``kind`` was written less
        than ``interval`` seconds ago; whether it was written."""
        now = self._clock()
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is not None and now - entry.last < self.interval:
                entry.held += 1
                return False
            held, since = (entry.held, now - entry.last) if entry is not None else (0, 0.0)
            self._kinds[kind] = _Kind(now)
        if held:
            message += f" ({held} more like it in the last {since:.0f} s)"
        self.logger.log(level, message, *args)
        return True

    def warning(self, kind: str, message: str, *args: object) -> bool:
        """:meth:`log` at WARNING."""
        return self.log(logging.WARNING, kind, message, *args)
