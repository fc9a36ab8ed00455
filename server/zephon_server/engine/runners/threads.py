"""The threads runner: each step's ``process_many`` calls run on a thread pool.

Operators are shared by the worker threads (``process_many`` is stateless); ``setup`` ran
once before data flows. Tokenizers from ``tokenizers`` release the GIL, so tokenization
scales with threads.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .base import PooledRunner
from .steps import Task


class ThreadsRunner(PooledRunner):
    """A pooled runner whose workers are threads of this process."""

    kind = "threads"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pools: dict[int, ThreadPoolExecutor] = {}

    def start_pool(self) -> None:
        for d in self.drivers:
            if d.step.workers == 0:
                continue  # runs in its driver thread
            self._pools[d.step.index] = ThreadPoolExecutor(
                max_workers=d.step.workers, thread_name_prefix=f"zephon-{d.step.name}"
            )

    def submit(self, task: Task) -> Future[list[Any]]:
        return self._pools[task.step.index].submit(task.step.run, task.elems)

    def stop_pool(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
