"""glibc malloc arenas: give every thread its own, so tokenizer threads never share one.

glibc's malloc serves each thread from an arena; it creates new arenas only up to
``8 * cores`` (16 on a 2-core machine) and then makes threads share. A Hugging Face tokenizer
allocates on every token, so two tokenizer threads that land on one arena serialize on its lock
and the whole pipeline runs several times slower at several times the CPU. Which threads share
is decided by thread start order, so the same process is fast on one start and slow on the
next; the service, with its gRPC and per-lane threads, is well past the limit (the measured
figures are in docs/decisions.md, "One malloc arena per thread").

:func:`widen_malloc_arenas` raises the limit (``mallopt(M_ARENA_MAX, ...)``). It is called by
:func:`zephon_server.runtime.apply` (``zephon`` commands call it first thing, before the
process starts its threads: glibc fixes the limit once a process has more than 8 arenas),
never on import. Memory stays bounded: an arena exists only for a thread that allocated, and
one freed by an ended thread is reused by the next. It does nothing off glibc. An explicit
``MALLOC_ARENA_MAX`` or ``GLIBC_TUNABLES=glibc.malloc.arena_max=N`` wins: the command line
sees it (:func:`user_set_arena_max`) and then asks for no limit.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: Arenas allowed: more than the threads a server runs (gRPC, lanes, runner workers).
ARENA_MAX = 256
_M_ARENA_MAX = -8  # from glibc's malloc.h


def user_set_arena_max(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` already chose an arena limit (which then wins)."""
    return "MALLOC_ARENA_MAX" in environ or "arena_max" in environ.get("GLIBC_TUNABLES", "")


def widen_malloc_arenas(limit: int = ARENA_MAX) -> bool:
    """Allow up to ``limit`` malloc arenas; True if the limit was set (False off glibc)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname (find_library would run ldconfig)
        ok = bool(libc.mallopt(_M_ARENA_MAX, limit))
    except (OSError, AttributeError):
        return False
    log.debug("malloc arenas: limit %d (%s)", limit, "set" if ok else "refused")
    return ok
