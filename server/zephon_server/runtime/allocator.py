"""The memory allocator ``zephon serve`` runs with: mimalloc when it is installed.

Hugging Face ``tokenizers`` allocates and frees on nearly every token, and under glibc's malloc
much of the tokenizer threads' CPU goes to ``malloc``/``free``; mimalloc costs far less per
token (``python -m bench.run`` measures both allocators; the figures and what did not help are
in docs/decisions.md).

An allocator replaces malloc only if it is loaded before anything else. The installed
``zephon`` command (``server/bin/zephon``, a shell launcher) preloads the library for the common
choices before Python starts, mirroring :data:`LIBRARY_DIRS`, :data:`KNOWN` and :data:`TUNING`;
otherwise :func:`ensure_allocator` re-executes the process once (same pid, same command line)
with ``LD_PRELOAD`` naming the library. Worker processes (``--runner processes``) inherit it.
:func:`decide` makes the choice (a pure function of the choice, the environment and the
library already mapped); :func:`ensure_allocator` carries it out. Every caller takes that same
path: ``zephon serve`` run as a program passes the command line that runs it again; code that
runs ``cli.main(argv)`` inside a process of its own (tests, embedding) passes none, and a
decision to re-execute is then logged, not carried out. An allocator that is already loaded
(``LD_PRELOAD`` set by the container image, say) never costs a re-execution.
Choices (``--allocator`` or ``ZEPHON_ALLOCATOR``):

``auto`` (default)
    an allocator already preloaded (``LD_PRELOAD``) is kept and named in the log, as is any
    other ``LD_PRELOAD``; else mimalloc, else jemalloc, if one is installed (Debian:
    ``libmimalloc2.0``, ``libjemalloc2``); else glibc's malloc, with a log line naming the
    package to install.
``mimalloc`` / ``jemalloc``
    that library; start-up fails naming the package when it is not installed.
``system``
    glibc's malloc (re-executes only to drop an allocator inherited through ``LD_PRELOAD``).
a path
    that shared library.

The allocator never changes the data: batches are bit-identical under every choice
(``tests/service/test_allocator.py`` compares the digests).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..engine.errors import ZephonError

log = logging.getLogger(__name__)

ENV = "ZEPHON_ALLOCATOR"
"""Environment variable giving the default of ``--allocator``."""
_MARK = "ZEPHON_ALLOCATOR_EXEC"  # set for the re-executed process only: never re-execute twice

KNOWN = {
    "mimalloc": (("libmimalloc.so.2", "libmimalloc.so.3", "libmimalloc.so"), "libmimalloc2.0"),
    "jemalloc": (("libjemalloc.so.2", "libjemalloc.so"), "libjemalloc2"),
}
"""Allocator name → (shared library names, the Debian package that installs them)."""
CHOICES = ("auto", *KNOWN, "system")
TUNING = {
    "mimalloc": {
        # mimalloc 2.0 (Debian bookworm's libmimalloc2.0): keep freed pages mapped.
        "MIMALLOC_ALLOW_DECOMMIT": "0",
        "MIMALLOC_RESET_DELAY": "1000000",
        # mimalloc >= 2.1 names the same thing purge_delay (-1: never).
        "MIMALLOC_PURGE_DELAY": "-1",
    },
}
"""Environment an allocator runs with when ``zephon serve`` preloads it (a variable the user
set wins). mimalloc by default hands freed pages back to the kernel after ~100 ms and then
takes page faults to use them again: the service's message buffers (~200 KB per batch, freed
at once) and the engine's batch tensors paid that on every batch. Keeping the pages cut the
server's CPU per token ~3% and the client's ~20% in four paired service runs (ad hoc, with
``bench.service``; ``docs/decisions.md``); the process then keeps its peak heap instead of
returning it."""
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
"""Where :func:`find_library` looks besides the dynamic linker's cache (``ldconfig -p``)."""


class AllocatorError(ZephonError, ValueError):
    """The allocator asked for is not installed or not a shared library."""


@dataclass(frozen=True)
class Allocator:
    """An allocator choice resolved: ``name`` and the library to preload (None: glibc)."""

    name: str
    library: str | None = None


def _ldconfig_paths() -> dict[str, str]:
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    paths: dict[str, str] = {}
    for line in out.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep:
            paths.setdefault(name.split(" (")[0], path.strip())
    return paths


def find_library(name: str, dirs: Sequence[str] = LIBRARY_DIRS) -> str | None:
    """The path of allocator ``name``'s shared library, or None when it is not installed.

    ``dirs`` first, in order, then the dynamic linker's cache: every default start-up looks,
    and a file found in a standard directory spares running ``ldconfig -p``.
    """
    sonames, _ = KNOWN[name]
    for soname in sonames:
        for directory in dirs:
            path = os.path.join(directory, soname)
            if os.path.exists(path):
                return path
    cache = _ldconfig_paths()
    for soname in sonames:
        if soname in cache and os.path.exists(cache[soname]):
            return cache[soname]
    return None


def resolve(choice: str, environ: Mapping[str, str] | None = None) -> Allocator:
    """The allocator ``choice`` stands for on this machine (see the module docstring)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if choice == "system":
        return Allocator("system")
    if choice == "auto":
        if env.get("LD_PRELOAD", "").strip():
            return Allocator("system")  # the user preloads something: keep it
        for name in KNOWN:
            found = find_library(name)
            if found is not None:
                return Allocator(name, found)
        return Allocator("system")
    if choice in KNOWN:
        found = find_library(choice)
        if found is None:
            libraries, package = KNOWN[choice]
            raise AllocatorError(
                f"--allocator {choice}: no {choice} library found (looked for "
                f"{', '.join(libraries)} in the linker cache and {', '.join(LIBRARY_DIRS)}); "
                f"install it (Debian/Ubuntu: apt-get install {package}), pass its path, or use "
                "--allocator auto or system"
            )
        return Allocator(choice, found)
    path = Path(choice)
    if "/" not in choice or not path.is_file():
        raise AllocatorError(
            f"--allocator {choice!r}: expected one of {', '.join(CHOICES)} or the path of a "
            "shared library (e.g. /usr/lib/x86_64-linux-gnu/libmimalloc.so.2)"
        )
    return Allocator(path.name, str(path.resolve()))


def is_allocator(path: str) -> bool:
    """Whether ``path`` names one of the :data:`KNOWN` allocators' libraries."""
    base = os.path.basename(path)
    return any(base.startswith(lib) for names, _ in KNOWN.values() for lib in names)


def loaded_library(maps: str = "/proc/self/maps", also: str | None = None) -> str | None:
    """The allocator library mapped into this process (Linux): a :data:`KNOWN` one, or the
    library ``also`` (any path to it); None when there is none."""
    wanted = os.path.realpath(also) if also else None
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.rsplit(" ", 1)[-1]
        if is_allocator(path) or (wanted is not None and path == wanted):
            return path
    return None


def name_of(library: str | None) -> str:
    """``mimalloc``, ``jemalloc``, another library's file name, or ``glibc`` (None)."""
    if library is None:
        return "glibc"
    base = os.path.basename(library)
    for name, (libraries, _) in KNOWN.items():
        if any(base.startswith(lib) for lib in libraries):
            return name
    return base


def current_name() -> str:
    """The allocator this process runs on (see :func:`name_of`)."""
    return name_of(loaded_library())


def describe(library: str | None) -> str:
    """A log line's words for the allocator in use."""
    return "glibc malloc" if library is None else f"{name_of(library)} ({library})"


@dataclass(frozen=True)
class Decision:
    """What :func:`ensure_allocator` does for a choice: run on as is (``preload`` None), or run
    this program again with ``LD_PRELOAD`` = ``preload`` (a tuple; empty drops the variable).

    ``name`` is the allocator the process runs (or will run) on; ``message`` the log line
    when nothing is re-executed, at ``level``.
    """

    choice: str
    name: str
    message: str
    preload: tuple[str, ...] | None = None
    level: int = logging.INFO

    @property
    def reexec(self) -> bool:
        """Whether carrying out the decision re-executes the process."""
        return self.preload is not None


GLIBC_HINT = (
    "memory allocator: glibc malloc; install mimalloc (Debian/Ubuntu: apt-get install "
    "libmimalloc2.0) for ~25% less CPU per token (--allocator, docs/operations.md)"
)


def decide(choice: str, environ: Mapping[str, str], loaded: str | None) -> Decision:
    """What running on ``choice`` takes, given ``environ`` and the allocator library mapped
    into the process (``loaded``, see :func:`loaded_library`). Raises
    :class:`AllocatorError` for a choice that is not installed."""
    preload = tuple(p for p in environ.get("LD_PRELOAD", "").split(":") if p)
    if choice == "system":
        if loaded is None:
            return Decision(choice, "glibc", "memory allocator: glibc malloc")
        kept = tuple(p for p in preload if not is_allocator(p))
        if kept == preload:
            return Decision(
                choice,
                name_of(loaded),
                f"memory allocator: --allocator system, but {describe(loaded)} is loaded by "
                "other means",
                level=logging.WARNING,
            )
        return Decision(choice, "glibc", "", preload=kept)
    if loaded is not None:  # preloaded already (LD_PRELOAD): never worth a re-execution
        return Decision(
            choice, name_of(loaded), f"memory allocator: {describe(loaded)}, preloaded already"
        )
    target = resolve(choice, environ)
    if target.library is not None:
        return Decision(choice, target.name, "", preload=(target.library, *preload))
    if preload:
        return Decision(
            choice, "glibc", f"memory allocator: as LD_PRELOAD sets it ({':'.join(preload)})"
        )
    return Decision(choice, "glibc", GLIBC_HINT if choice == "auto" else "memory allocator: glibc")


def ensure_allocator(
    choice: str, exec_argv: Sequence[str] | None, environ: dict[str, str] | None = None
) -> Decision:
    """Make this process run on ``choice`` (see the module docstring); returns the decision.

    ``exec_argv`` is the command line that runs this program again (``sys.orig_argv`` for the
    ``zephon`` program); None when the process is not the program's own (tests, embedding):
    a decision to re-execute is then logged and not carried out. ``environ`` (default
    ``os.environ``) loses the re-execution mark here. Never returns when it re-executes.
    """
    env = os.environ if environ is None else environ
    if env.pop(_MARK, None) is not None:  # this is the re-executed process
        wanted = env.get("LD_PRELOAD", "").split(":")[0]
        current = loaded_library(also=wanted if choice != "system" else None)
        if current is None and choice != "system":
            log.warning(
                "memory allocator: %s could not be preloaded; running on glibc malloc", wanted
            )
            return Decision(choice, "glibc", "")
        log.info("memory allocator: %s (re-executed to preload it)", describe(current))
        return Decision(choice, name_of(current), "")
    decision = decide(choice, env, loaded_library())
    if not decision.reexec:
        log.log(decision.level, "%s", decision.message)
    elif exec_argv is None:
        log.info(
            "memory allocator: %s; not re-executing on %s in a process that is not zephon's "
            "own (set LD_PRELOAD=%s before starting it to use it)",
            describe(loaded_library()),
            decision.name,
            ":".join(decision.preload or ()) or "''",
        )
    else:
        _reexec(list(decision.preload or ()), decision.name, exec_argv, env)
    return decision


def requested(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """The ``--allocator`` a ``zephon serve`` command line asks for, read without its parser.

    The last ``--allocator X`` or ``--allocator=X``, else ``ZEPHON_ALLOCATOR``, else ``auto``
    (the defaults of ``--allocator``). Reading it before the parser exists lets the server
    re-execute before importing numpy, gRPC and the engine, which the new image imports
    anyway; the CLI checks it against the parsed value (an abbreviated flag) afterwards.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    choice = env.get(ENV) or "auto"
    words = list(argv)
    for i, word in enumerate(words):
        if word == "--":
            break
        if word == "--allocator" and i + 1 < len(words):
            choice = words[i + 1]
        elif word.startswith("--allocator="):
            choice = word.partition("=")[2]
    return choice


def tuned_environ(name: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` plus allocator ``name``'s :data:`TUNING` (variables already set are kept)."""
    return {**TUNING.get(name, {}), **environ}


def _reexec(
    preload: list[str], name: str, argv: Sequence[str], environ: Mapping[str, str]
) -> NoReturn:
    """Run this program again, same pid and arguments, with ``LD_PRELOAD`` = ``preload``."""
    env = dict(environ)
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    env = tuned_environ(name, env)
    env[_MARK] = name
    args = list(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, args, env)
