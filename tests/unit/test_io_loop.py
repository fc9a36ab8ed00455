"""The client's I/O loop: one shared thread, a bounded mailbox, a fresh loop after fork."""

from __future__ import annotations

import asyncio
import threading

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


def test_mailbox_put_nowait_ignores_the_bound_and_wakes_the_consumer():
    box: io_loop.Mailbox[str] = io_loop.Mailbox(1)
    box.put_nowait("a")
    box.put_nowait("b")
    threading.Timer(0.05, box.put_nowait, args=("c",)).start()
    assert [box.get(timeout=5) for _ in range(3)] == ["a", "b", "c"]


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
