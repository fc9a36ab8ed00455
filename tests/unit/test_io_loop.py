"""The client's I/O loop: one shared thread, a bounded mailbox, a fresh loop after fork."""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time

import pytest

from zephon_client import io_loop


def test_one_loop_thread_serves_every_caller():
    first = io_loop.loop()
    assert io_loop.loop() is first and first.is_running()
    names = {io_loop.run(lambda: threading.current_thread().name) for _ in range(3)}
    assert names == {"zephon-client-io"}

    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    assert io_loop.run(lambda: add(2, 3), timeout=5) == 5
    assert io_loop.submit(add(1, 1)).result(5) == 2


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


def test_mailbox_put_nowait_ignores_the_bound_and_wakes_the_consumer():
    box: io_loop.Mailbox[str] = io_loop.Mailbox(1)
    box.put_nowait("a")
    box.put_nowait("b")
    threading.Timer(0.05, box.put_nowait, args=("c",)).start()
    assert [box.get(timeout=5) for _ in range(3)] == ["a", "b", "c"]


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


def test_only_grpc_poller_wake_up_errors_are_silenced(caplog):
    loop = io_loop.loop()
    assert loop.get_exception_handler() is io_loop._exception_handler
    with caplog.at_level("DEBUG", logger="zephon_client.io_loop"):
        io_loop._exception_handler(
            loop, {"message": "Exception in callback", "exception": BlockingIOError(11, "x")}
        )
    assert "spurious" in caplog.text
    caplog.clear()
    with caplog.at_level("ERROR", logger="asyncio"):
        io_loop._exception_handler(
            loop, {"message": "Exception in callback", "exception": ValueError("real")}
        )
    assert "real" in caplog.text  # anything else reaches asyncio's default handler
