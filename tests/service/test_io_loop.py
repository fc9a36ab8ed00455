"""The client's I/O loop: one shared thread, a bounded mailbox, a fresh loop after fork: the tests
that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_io_loop.py``.
"""

from __future__ import annotations

import os
import queue
import time

import pytest

from zephon_client import io_loop


def test_mailbox_holds_the_producer_back_while_full_and_keeps_order():
    box: io_loop.Mailbox[int] = io_loop.Mailbox(2)
    put = []

    async def produce() -> None:
        for i in range(6):
            await box.put(i)
            put.append(i)

    done = io_loop.submit(produce())
    deadline = time.monotonic() + 5
    while len(put) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert put == [0, 1]  # the third put waits for room
    got = [box.get(timeout=5) for _ in range(6)]
    assert got == list(range(6))
    done.result(5)
    with pytest.raises(queue.Empty):
        box.get(timeout=0.05)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_loop():
    parent = io_loop.loop()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's loop thread is gone; a new one must start and work
        ok = b"0"
        try:
            child = io_loop.loop()
            ok = b"1" if child is not parent and io_loop.run(lambda: 7, timeout=5) == 7 else b"0"
        finally:
            os.write(write, ok)
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert io_loop.loop() is parent
