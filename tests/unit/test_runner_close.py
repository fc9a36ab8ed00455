"""A pooled runner's close returns once its pool is stopped, whoever calls it first.

The run releases the shared-memory blocks of the processes runner's results right after
closing its runners: a second close that returned while the first was still stopping the
pool let results relayed after that register blocks nobody released (one such block was
seen left in /dev/shm by a CI run).
"""

from __future__ import annotations

import threading

from zephon_server.engine.runners.threads import ThreadsRunner


class HeldStop(ThreadsRunner):
    """A runner whose pool stops only when the test lets it (in-flight tasks finishing)."""

    def __init__(self) -> None:
        super().__init__([], workers=1)
        self.release = threading.Event()
        self.stopped = False

    def stop_pool(self) -> None:
        self.release.wait(10)
        self.stopped = True
        super().stop_pool()


def test_a_second_close_waits_for_the_first_to_stop_the_pool():
    runner = HeldStop()
    first = threading.Thread(target=runner.close)
    first.start()
    assert runner._stop.wait(10)  # the first close is under way
    seen: list[bool] = []
    second = threading.Thread(target=lambda: (runner.close(), seen.append(runner.stopped)))
    second.start()
    second.join(0.3)  # time for a close that does not wait to return
    runner.release.set()
    first.join(10)
    second.join(10)
    assert seen == [True]  # it returned after the pool had stopped


def test_close_twice_in_one_thread_returns():
    runner = HeldStop()
    runner.release.set()
    runner.close()
    runner.close()
    assert runner.stopped
