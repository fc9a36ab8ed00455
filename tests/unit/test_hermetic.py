"""The unit tier's guard (``tests/support/hermetic.py``): every blocked call fails with a message
naming the rule and the tier to move the test to, and an attempt that the code under test
swallows, or that happens in another thread, still fails the test at teardown."""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.support.hermetic import HermeticGuard, NotHermetic


def _connect() -> None:
    with socket.socket() as s:
        s.connect(("127.0.0.1", 9))


def _bind() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


BLOCKED = {
    "socket connect": _connect,
    "socket bind": _bind,
    "create_connection": lambda: socket.create_connection(("127.0.0.1", 9), timeout=1),
    "gRPC server": lambda: grpc.server(ThreadPoolExecutor(1)),
    "gRPC channel": lambda: grpc.insecure_channel("127.0.0.1:9"),
    "subprocess": lambda: subprocess.run(["true"], check=True),
    "process": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "sleep": lambda: time.sleep(0.01),
}


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_each_blocked_call_names_the_rule_and_the_tier(hermetic: HermeticGuard, name: str):
    with pytest.raises(NotHermetic, match=r"tests/unit is hermetic .* move it to tests/service"):
        BLOCKED[name]()
    assert hermetic.nodeid in hermetic.violations[0]
    hermetic.violations.clear()  # the attempt was the point of this test


def test_a_swallowed_attempt_still_fails_the_test_at_teardown(hermetic: HermeticGuard):
    try:
        time.sleep(1)
    except NotHermetic:
        pass
    with pytest.raises(NotHermetic, match=r"time\.sleep\(1\)"):
        hermetic.check()
    hermetic.check()  # reported once


def test_an_attempt_in_another_thread_is_recorded(hermetic: HermeticGuard):
    def work() -> None:
        try:
            subprocess.run(["true"], check=True)
        except NotHermetic:
            pass

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    with pytest.raises(NotHermetic, match="a subprocess"):
        hermetic.check()


def test_yields_threads_and_socket_pairs_stay_allowed():
    time.sleep(0)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"
