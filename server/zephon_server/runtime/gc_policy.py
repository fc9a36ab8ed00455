"""The garbage-collector settings of the processes Zephon owns: the server and runner workers.

The engine allocates a few container objects per record (records, metas, spans, document
refs) that almost all die young, freed by reference counting. CPython's default first
generation threshold (700) still runs a young collection every 700 net allocations, and every
tenth of those scans the second generation, every tenth of *those* the whole heap (the
interpreter's modules, the compiled pipeline): a measurable share of the processes runner's
main process (docs/decisions.md has the measurement). ``tuned`` (the default) freezes what
exists at start-up (``gc.freeze``: the imports and the compiled pipeline, never garbage) and
raises the first threshold to :data:`THRESHOLD`, so collections become rare. Cyclic garbage is
still collected, only in larger steps.

The policy is a field of :class:`~zephon_server.runtime.RuntimeConfig`: ``zephon`` commands
build it from ``--gc`` (or ``ZEPHON_GC``) and apply it before the pipeline starts, and the
runners hand the same config to their worker processes and Ray actors, which apply it when
they start (they read no environment). Code that embeds the engine in its own process decides
for itself: call :func:`apply` to get the same settings. Collection settings never change the
data.
"""

from __future__ import annotations

import gc
import logging

from ..engine.errors import ConfigError

log = logging.getLogger(__name__)

ENV = "ZEPHON_GC"
"""Environment variable: the policy when ``--gc`` is not given (read by the command line)."""

CHOICES = ("tuned", "default")

THRESHOLD = (10_000, 10, 10)
"""``gc.set_threshold`` under ``tuned``: a young collection per 10,000 net allocations."""


class GcPolicyError(ConfigError):
    """An unknown ``--gc`` / ``ZEPHON_GC`` value."""


def check(mode: str) -> str:
    """``mode`` if it is one of :data:`CHOICES`; :class:`GcPolicyError` naming them otherwise."""
    if mode not in CHOICES:
        raise GcPolicyError(
            f"unknown garbage-collector policy {mode!r} (--gc or {ENV}); "
            f"choose one of: {', '.join(CHOICES)}"
        )
    return mode


def apply(mode: str = "tuned") -> None:
    """Apply ``mode`` to this process: ``tuned`` collects once, freezes every object that
    exists (they become permanent: the collector no longer scans them) and sets
    :data:`THRESHOLD`; ``default`` leaves CPython's settings alone."""
    if check(mode) == "default":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLD)
    log.debug("gc: %d objects frozen, thresholds %s", gc.get_freeze_count(), THRESHOLD)
