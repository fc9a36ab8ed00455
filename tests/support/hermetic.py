"""The rule of the unit tier: no sockets, no subprocesses or child processes, no sleeps.

``HermeticGuard.install`` replaces the entry points of those with functions that raise
``NotHermetic``, a message naming what was attempted, the test, and the tier to move it to.
``tests/unit/conftest.py`` installs it around every unit test. A violation that the code under
test catches (or that happens in a background thread) is still recorded, and ``check`` fails the
test at teardown, so a swallowed error cannot keep a slow or flaky test in the fast tier.

Session fixtures set up before the guard (the shared corpus) are not covered: a unit test may
use them only if they are hermetic too. ``time.sleep(0)`` (a thread yield) is allowed.
"""

from __future__ import annotations

import multiprocessing.process
import multiprocessing.util
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest

RULE = "no sockets, no subprocesses or child processes, no sleeps"
MOVE_TO = (
    "move it to tests/service (real servers, subprocesses, worker processes, Ray, S3) or "
    "tests/reliability (faults on purpose, hostile input, limits, load); see tests/README.md"
)

# (module or class, attribute, what it is called in the message)
_SOCKETS: tuple[tuple[Any, str, str], ...] = (
    (socket.socket, "connect", "a socket connect"),
    (socket.socket, "connect_ex", "a socket connect"),
    (socket.socket, "bind", "a socket bind"),
    (socket, "create_connection", "socket.create_connection"),
    (socket, "create_server", "socket.create_server"),
    (socket, "getaddrinfo", "a DNS lookup (socket.getaddrinfo)"),
    (grpc, "server", "a gRPC server"),
    (grpc, "insecure_channel", "a gRPC channel"),
    (grpc, "secure_channel", "a gRPC channel"),
    (grpc.aio, "server", "a gRPC server"),
    (grpc.aio, "insecure_channel", "a gRPC channel"),
    (grpc.aio, "secure_channel", "a gRPC channel"),
)
_PROCESSES: tuple[tuple[Any, str, str], ...] = (
    (subprocess.Popen, "_execute_child", "a subprocess"),
    (multiprocessing.process.BaseProcess, "start", "a multiprocessing process"),
    # how multiprocessing starts its helpers (the resource tracker that shared memory starts)
    (multiprocessing.util, "spawnv_passfds", "a multiprocessing helper process"),
    (os, "fork", "os.fork"),
    (os, "forkpty", "os.forkpty"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
    (os, "execv", "os.execv (re-executing the process)"),
    (os, "execve", "os.execve (re-executing the process)"),
)


class NotHermetic(AssertionError):
    """A unit test used a socket, a child process or a sleep."""


class HermeticGuard:
    """Blocks sockets, child processes and sleeps for one test and remembers every attempt."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.violations: list[str] = []
        self._lock = threading.Lock()

    def error(self, what: str) -> NotHermetic:
        """Record the attempt and return the error to raise."""
        message = f"tests/unit is hermetic ({RULE}): {self.nodeid} used {what}; {MOVE_TO}"
        with self._lock:
            self.violations.append(message)
        return NotHermetic(message)

    def _blocker(self, what: str) -> Callable[..., Any]:
        def blocked(*args: Any, **kwargs: Any) -> Any:
            raise self.error(what)

        return blocked

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Replace every blocked entry point; ``monkeypatch`` restores them after the test."""
        for owner, name, what in _SOCKETS + _PROCESSES:
            if hasattr(owner, name):
                monkeypatch.setattr(owner, name, self._blocker(what))
        real_sleep = time.sleep

        def sleep(seconds: float) -> None:
            if seconds > 0:
                raise self.error(f"time.sleep({seconds!r})")
            real_sleep(0)

        monkeypatch.setattr(time, "sleep", sleep)

    def check(self) -> None:
        """Fail if anything was attempted, even when the code under test caught the error."""
        with self._lock:
            found, self.violations = self.violations, []
        if found:
            raise NotHermetic(
                found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
            )
