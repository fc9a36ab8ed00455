"""The runtime's process tuning lets every thread have its own glibc malloc arena (see
runtime/arenas.py), and importing the engine alone does not: counted with ``malloc_info`` in
fresh processes whose threads allocate at the same time."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# More threads than glibc's default limit (8 arenas per core), all allocating at once.
THREADS = 8 * (os.cpu_count() or 1) + 8

COUNT_ARENAS = """
import ctypes, sys, tempfile, threading
if sys.argv[1] == "engine":
    import zephon_server.engine  # noqa: F401
if sys.argv[1] == "runtime":  # as the zephon command does: the config from the environment
    import os
    from zephon_server.runtime import from_environ
    from_environ(os.environ).apply_process()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
n = int(sys.argv[2])
barrier = threading.Barrier(n + 1)
def work():
    libc.malloc(4000)
    barrier.wait()  # every thread holds its arena until all have allocated
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(n)]
for t in threads:
    t.start()
barrier.wait()
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    f = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
    print(open(out.name).read().count("<heap nr="))
barrier.wait()
"""


def arenas(mode: str, env: dict[str, str] | None = None) -> int:
    environ = {
        k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")
    }
    proc = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, mode, str(THREADS)],
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(proc.stdout.strip())


def test_plain_glibc_makes_threads_share_arenas():
    # The problem: past 8 per core, threads share arenas (and tokenizer threads serialize).
    assert arenas("plain") < THREADS


def test_the_runtime_gives_every_thread_its_own_arena():
    assert arenas("runtime") >= THREADS


def test_importing_the_engine_leaves_the_arenas_alone():
    # No import-time side effect: the engine alone behaves as plain glibc.
    assert arenas("engine") < THREADS


def test_an_explicit_arena_limit_wins():
    assert arenas("runtime", {"MALLOC_ARENA_MAX": "2"}) <= 2
    assert arenas("runtime", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=3"}) <= 3
