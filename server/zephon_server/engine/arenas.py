"""glibc malloc arenas: give every thread its own, so tokenizer threads never share one.

glibc's malloc serves each thread from an arena; it creates new arenas only up to
``8 * cores`` (16 on a 2-core machine) and then makes threads share. A Hugging Face tokenizer
allocates on every token, so two tokenizer threads that land on one arena serialize on its lock
and the whole pipeline runs several times slower at several times the CPU. Which threads share
is decided by thread start order, so the same process is fast on one start and slow on the
next; the service, with its gRPC and per-lane threads, is well past the limit (the measured
figures are in docs/decisions.md, "One malloc arena per thread").

:func:`widen_malloc_arenas` raises the limit (``mallopt(M_ARENA_MAX, ...)``) when the engine is
imported, before the process has started its threads (glibc fixes the limit once a process has
more than 8 arenas). Memory stays bounded: an arena exists only for a thread that allocated,
and one freed by an ended thread is reused by the next. It does nothing off glibc, and an
explicit ``MALLOC_ARENA_MAX`` or ``GLIBC_TUNABLES=glibc.malloc.arena_max=N`` wins.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

#: Arenas allowed: more than the threads a server runs (gRPC, lanes, runner workers).
ARENA_MAX = 256
_M_ARENA_MAX = -8  # from glibc's malloc.h


def user_set_arena_max() -> bool:
    """True when the environment already chose an arena limit (which then wins)."""
    return "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", "")


def widen_malloc_arenas(limit: int = ARENA_MAX) -> bool:
    """Allow up to ``limit`` malloc arenas; True if the limit was set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or user_set_arena_max():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname (find_library would run ldconfig)
        ok = bool(libc.mallopt(_M_ARENA_MAX, limit))
    except (OSError, AttributeError):
        return False
    log.debug("malloc arenas: limit %d (%s)", limit, "set" if ok else "refused")
    return ok
