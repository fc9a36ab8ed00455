"""Process tuning: how a Zephon process and its workers run, never what they compute.

Four settings, each in its own module here, gathered in one frozen :class:`RuntimeConfig`:

* the memory allocator (:mod:`.allocator`): preloaded by re-executing ``zephon serve``;
* glibc malloc arenas (:mod:`.arenas`): one per thread, so tokenizer threads never share;
* the garbage-collector policy (:mod:`.gc_policy`);
* tokenizer threading: Hugging Face ``tokenizers`` threads inside each call only when asked.

Nothing here happens on import, and nothing below the command line reads the environment for
it: the ``zephon`` command builds the config once from its flags and environment
(:func:`zephon_server.serve_flags.runtime_config`), calls :func:`apply` before its pipeline
starts, and hands the same config to the engine (``ExecutionConfig.worker_tuning``), whose
runners give it to every worker process and Ray actor they start; those call
:meth:`RuntimeConfig.apply_in_worker`. Code that embeds the engine decides for itself:
``apply(RuntimeConfig())`` gives it the server's settings. None of it changes a byte of data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..engine.errors import ConfigError
from . import gc_policy
from .allocator import CHOICES as ALLOCATOR_CHOICES
from .allocator import ENV as ALLOCATOR_ENV
from .arenas import ARENA_MAX, user_set_arena_max, widen_malloc_arenas

log = logging.getLogger(__name__)

TOKENIZERS_ENV = "TOKENIZERS_PARALLELISM"
"""Hugging Face ``tokenizers``' own switch for threading inside each call (it reads it)."""
_FALSE = ("", "off", "false", "f", "no", "n", "0")  # what tokenizers reads as false

__all__ = [
    "ALLOCATOR_CHOICES",
    "ALLOCATOR_ENV",
    "ARENA_MAX",
    "RuntimeConfig",
    "apply",
    "from_environ",
]


@dataclass(frozen=True)
class RuntimeConfig:
    """How a Zephon process is tuned (see the module docstring); frozen and picklable, so the
    runners hand it to their workers as it is.

    ``allocator``: an ``--allocator`` choice (``auto``, ``mimalloc``, ``jemalloc``, ``system``
    or a library path); only the command line acts on it, by re-executing (workers inherit the
    preload). ``gc``: ``tuned`` or ``default``. ``malloc_arenas``: the glibc arena limit to
    set, None to leave glibc's (the user set one). ``tokenizers_parallelism``: whether
    ``tokenizers`` threads inside each call (the runners already run several calls at once).
    """

    allocator: str = "auto"
    gc: str = "tuned"
    malloc_arenas: int | None = ARENA_MAX
    tokenizers_parallelism: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.allocator, str) or not self.allocator:
            raise ConfigError(
                f"--allocator: expected one of {', '.join(ALLOCATOR_CHOICES)} or a library "
                f"path, got {self.allocator!r}"
            )
        gc_policy.check(self.gc)
        arenas = self.malloc_arenas
        if arenas is not None and (
            isinstance(arenas, bool) or not isinstance(arenas, int) or not 1 <= arenas <= 4096
        ):
            raise ConfigError(
                f"malloc_arenas: must be a whole number between 1 and 4096 (None: glibc's "
                f"default), got {arenas!r}"
            )
        if not isinstance(self.tokenizers_parallelism, bool):
            raise ConfigError(
                f"tokenizers_parallelism: must be true or false, got "
                f"{self.tokenizers_parallelism!r}"
            )

    def apply_process(self) -> None:
        """The settings that must come before the process starts threads: malloc arenas
        (glibc fixes the limit once a process has more than 8) and tokenizer threading
        (``tokenizers`` reads its switch from the environment when it first threads; the value
        is this config's, built from the same variable when the user set it)."""
        if self.malloc_arenas is not None:
            widen_malloc_arenas(self.malloc_arenas)
        os.environ[TOKENIZERS_ENV] = "true" if self.tokenizers_parallelism else "false"

    def apply_gc(self) -> None:
        """The garbage-collector policy: ``tuned`` freezes every object that exists, so call
        it once the long-lived ones (imports, the compiled pipeline) are there."""
        gc_policy.apply(self.gc)

    def apply(self) -> None:
        """Every setting at once (see :func:`apply`)."""
        self.apply_process()
        self.apply_gc()
        log.debug("runtime: %s", self)

    def apply_in_worker(self) -> None:
        """Tune a worker process or Ray actor a runner started: the same settings as its
        parent (the allocator it inherited with the environment)."""
        self.apply()


def apply(config: RuntimeConfig) -> None:
    """Tune this process as ``config`` says: arenas and tokenizer threading, then the garbage
    collector (which freezes what exists now: call it once the imports are done). A server
    calls :meth:`RuntimeConfig.apply_process` first thing and :meth:`RuntimeConfig.apply_gc`
    once its pipeline is compiled instead. The allocator is not applied here: it takes a
    re-execution (:func:`.allocator.ensure_allocator`), which only the command line can do."""
    config.apply()


def from_environ(
    environ: Mapping[str, str], *, allocator: str | None = None, gc: str | None = None
) -> RuntimeConfig:
    """The config the command line builds: ``allocator`` / ``gc`` (its flags) win over
    ``ZEPHON_ALLOCATOR`` / ``ZEPHON_GC``; an arena limit or ``TOKENIZERS_PARALLELISM`` the
    user set in ``environ`` is kept."""
    parallel = environ.get(TOKENIZERS_ENV)
    return RuntimeConfig(
        allocator=allocator or environ.get(ALLOCATOR_ENV) or "auto",
        gc=gc or environ.get(gc_policy.ENV) or "tuned",
        malloc_arenas=None if user_set_arena_max(environ) else ARENA_MAX,
        tokenizers_parallelism=parallel is not None and parallel.strip().lower() not in _FALSE,
    )
