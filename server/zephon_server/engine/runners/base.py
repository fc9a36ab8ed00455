"""Runner interface and the pooled-runner skeleton shared by threads, processes and Ray.

A runner executes one *stage* (a list of steps). It consumes an iterator of item lists
(elements and controls, in stream order) and yields item lists in the same per-lane order.
The pooled skeleton gives every step a driver thread (accumulator, serial) that dispatches
tasks to a worker pool with a sequence number, and a collector thread that releases results
through the step's :class:`ReorderBuffer` to the next step. Consecutive steps without workers
(``workers == 0``: cheap work run in the driver) share one driver thread instead, which runs
them like the inline runner, with no reorder buffer or queue between them, handing each
task's output on before running the next (:func:`cascade`). Bounded queues, the reorder
buffer's in-flight capacity and that piecewise hand-on give backpressure end to end: a
consumer that stops pulling stops the work, however much one input expands.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from ..errors import WorkerError, ZephonError
from ..reorder import ReorderBuffer, ReorderBufferClosed
from .steps import StepDriver, Task

log = logging.getLogger(__name__)

ItemList = list[Any]
_END = object()


class _Error:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Placed(Exception):
    """A dispatch failed and its error already holds the failed item's place in the reorder
    buffer: the driver stops without reserving another."""


class StageRunner:
    """Executes the steps of one stage; subclasses choose where ``Step.run`` executes."""

    kind = "base"

    def __init__(
        self,
        drivers: list[StepDriver],
        *,
        workers: int = 1,
        ordered: bool = True,
        queue_depth: int = 4,
    ) -> None:
        self.drivers = drivers
        self.workers = workers
        self.ordered = ordered
        self.queue_depth = queue_depth

    def run(self, upstream: Iterator[ItemList]) -> Iterator[ItemList]:
        """Consume upstream item lists and yield this stage's output item lists."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop threads and pools (idempotent)."""

    def reorder_stats(self) -> dict[str, tuple[int, int]]:
        """(current, max) reorder-buffer depth per step (pooled runners)."""
        return {}

    def queue_depths(self) -> dict[str, int]:
        """Item lists waiting in each inter-step queue (pooled runners)."""
        return {}


def execute_inline(items: list[Any]) -> list[Any]:
    """Run the tasks among ``items`` on the calling thread, keeping controls in place."""
    out: list[Any] = []
    for item in items:
        if type(item) is Task:
            out.extend(item.step.run(item.elems))
        else:
            out.append(item)
    return out


def cascade(drivers: list[StepDriver], items: list[Any], *, ordered: bool) -> Iterator[list[Any]]:
    """Push ``items`` through ``drivers`` on the calling thread (the inline runner's way),
    yielding the last step's output piece by piece; unordered, each step also releases its
    latency flushes.

    Each task's result goes through the following steps before the next task runs, so an
    input that expands into many outputs (one huge document packed into thousands of rows)
    never exists all at once, and a consumer that stops pulling (the hub's producer waiting
    for acknowledgements) stops the work. Every accumulator sees the same elements in the
    same order as with one call per step; only the grouping of its ``push_many`` calls is
    finer, which never changes its output."""
    if not drivers:
        if items:
            yield items
        return
    driver, rest = drivers[0], drivers[1:]
    out = driver.feed(items)
    if not ordered:
        out.extend(driver.poll())
    pending: list[Any] = []
    for item in out:
        if type(item) is Task:
            pending.extend(item.step.run(item.elems))
            yield from cascade(rest, pending, ordered=ordered)
            pending = []
        else:
            pending.append(item)
    if pending:
        yield from cascade(rest, pending, ordered=ordered)


def cascade_release(drivers: list[StepDriver], *, end: bool) -> list[Any]:
    """What ``drivers`` release with no new input: everything at the end of the stream
    (``end``), else their latency flushes, each step's output fed to the next."""
    items: list[Any] = []
    for driver in drivers:
        released = driver.finish() if end else driver.poll()
        items = execute_inline(driver.feed(items)) + execute_inline(released)
    return items


#: Longest a second caller of :meth:`PooledRunner.close` waits for the first to finish (the
#: pool's in-flight tasks run to their end first).
CLOSE_WAIT = 60.0


class PooledRunner(StageRunner):
    """Driver + worker pool + reorder buffer per step; see the module docstring."""

    kind = "pooled"
    poll_interval = 0.05

    def __init__(self, drivers: list[StepDriver], **kwargs: Any) -> None:
        super().__init__(drivers, **kwargs)
        self._stop = threading.Event()
        self._closed = threading.Event()  # set once close() has stopped the pool
        self._threads: list[threading.Thread] = []
        self._buffers: list[ReorderBuffer] = []
        self._queues: list[queue.Queue[Any]] = []

    # -- subclass hooks -------------------------------------------------------------------

    def start_pool(self) -> None:
        """Start the workers (called once before data flows)."""
        raise NotImplementedError

    def submit(self, task: Task) -> Future[list[Any]]:
        """Run ``task.step.run(task.elems)`` on a worker; a future of its result."""
        raise NotImplementedError

    def stop_pool(self) -> None:
        """Stop the workers."""

    # -- skeleton -------------------------------------------------------------------------

    def reorder_stats(self) -> dict[str, tuple[int, int]]:
        return {d.step.name: (rb.depth, rb.max_depth) for d, rb in zip(self.drivers, self._buffers)}

    def queue_depths(self) -> dict[str, int]:
        names = ["source", *(d.step.name for d in self.drivers)]
        return {
            f"into:{n}" if i else "source": q.qsize()
            for i, (n, q) in enumerate(zip(names, self._queues))
        }

    def run(self, upstream: Iterator[ItemList]) -> Iterator[ItemList]:
        self.start_pool()
        n = len(self.drivers)
        self._queues = [queue.Queue(maxsize=self.queue_depth) for _ in range(n + 1)]
        self._buffers = [
            ReorderBuffer(max(2, 2 * d.step.workers), ordered=self.ordered) for d in self.drivers
        ]
        self._spawn(self._feed, upstream, self._queues[0], name="feeder")
        i = 0
        while i < n:
            driver = self.drivers[i]
            if driver.step.workers == 0:
                # A run of in-driver steps shares one thread, without hand-offs between them.
                j = i
                while j + 1 < n and self.drivers[j + 1].step.workers == 0:
                    j += 1
                chain = self.drivers[i : j + 1]
                name = "+".join(d.step.name for d in chain)
                self._spawn(
                    self._drive_chain,
                    chain,
                    self._queues[i],
                    self._queues[j + 1],
                    name=f"drive-{name}",
                )
                i = j + 1
                continue
            rb = self._buffers[i]
            self._spawn(self._drive, driver, self._queues[i], rb, name=f"drive-{driver.step.name}")
            self._spawn(self._collect, rb, self._queues[i + 1], name=f"collect-{driver.step.name}")
            i += 1
        out_q = self._queues[-1]
        try:
            while True:
                try:
                    item = out_q.get(timeout=0.1)
                except queue.Empty:
                    if self._stop.is_set():
                        return
                    continue
                if item is _END:
                    return
                if type(item) is _Error:
                    raise item.exc
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the threads and the pool. Returns once they are stopped, also when another
        thread is closing the runner (the run releases the shared-memory blocks of the results
        next: a pool still relaying results would register blocks after that), except in a
        thread of this runner, which the closing thread may be joining."""
        me = threading.current_thread()
        if self._stop.is_set():
            if me not in self._threads:
                self._closed.wait(CLOSE_WAIT)
            return
        self._stop.set()
        try:
            for rb in self._buffers:
                rb.close()
            for q in self._queues:  # unblock producers
                try:
                    while True:
                        q.get_nowait()
                except queue.Empty:
                    pass
            deadline = time.monotonic() + 5
            for t in self._threads:
                if t is not me:
                    t.join(timeout=max(0.0, deadline - time.monotonic()))
            self.stop_pool()
        finally:
            self._closed.set()

    def _spawn(self, target: Callable[..., None], *args: Any, name: str) -> None:
        t = threading.Thread(target=target, args=args, name=f"zephon-{name}", daemon=True)
        t.start()
        self._threads.append(t)  # only started threads are joined by close()

    def _put(self, q: queue.Queue[Any], item: Any) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _feed(self, upstream: Iterator[ItemList], q: queue.Queue[Any]) -> None:
        try:
            for items in upstream:
                if not self._put(q, items):
                    return
            self._put(q, _END)
        except BaseException as exc:
            self._put(q, _Error(exc))

    def _drive(self, driver: StepDriver, q: queue.Queue[Any], rb: ReorderBuffer) -> None:
        timeout = 0.1 if self.ordered else self.poll_interval
        try:
            while not self._stop.is_set():
                try:
                    items = q.get(timeout=timeout)
                except queue.Empty:
                    if not self.ordered:
                        self._dispatch(driver.poll(), rb)
                    continue
                if items is _END:
                    self._dispatch(driver.finish(), rb)
                    rb.complete(rb.reserve(), _END, control=True)
                    return
                if type(items) is _Error:
                    rb.complete(rb.reserve(), items, control=True)
                    return
                self._dispatch(driver.feed(items), rb)
                if not self.ordered:
                    self._dispatch(driver.poll(), rb)
        except (ReorderBufferClosed, _Placed):
            return
        except BaseException as exc:
            with contextlib.suppress(ReorderBufferClosed):
                rb.complete(rb.reserve(), _Error(exc), control=True)

    def _drive_chain(
        self, drivers: list[StepDriver], q: queue.Queue[Any], out_q: queue.Queue[Any]
    ) -> None:
        """Consecutive in-driver steps on one thread, as the inline runner runs them."""
        timeout = 0.1 if self.ordered else self.poll_interval
        try:
            while not self._stop.is_set():
                try:
                    items = q.get(timeout=timeout)
                except queue.Empty:
                    if not self.ordered:
                        items = cascade_release(drivers, end=False)
                        if items and not self._put(out_q, items):
                            return
                    continue
                if items is _END:
                    items = cascade_release(drivers, end=True)
                    if items and not self._put(out_q, items):
                        return
                    self._put(out_q, _END)
                    return
                if type(items) is _Error:
                    self._put(out_q, items)
                    return
                for piece in cascade(drivers, items, ordered=self.ordered):
                    if not self._put(out_q, piece):
                        return
        except BaseException as exc:
            self._put(out_q, _Error(exc))

    def _dispatch(self, items: list[Any], rb: ReorderBuffer) -> None:
        """Give each item its place in ``rb``. An item that cannot be run or submitted (a pool
        that cannot start its workers, say) takes its error to its own place: the collector
        waits for every place in order, so an error put anywhere later would never be reached
        and the run would wait for ever."""
        for item in items:
            seq = rb.reserve()
            try:
                if type(item) is Task and item.step.workers == 0:
                    rb.complete(seq, item.step.run(item.elems))
                elif type(item) is Task:
                    future = self.submit(item)
                    future.add_done_callback(_completer(rb, seq, item.step.name))
                else:
                    rb.complete(seq, item, control=True)
            except BaseException as exc:
                rb.complete(seq, _Error(exc), control=True)
                raise _Placed() from exc

    def _collect(self, rb: ReorderBuffer, q: queue.Queue[Any]) -> None:
        try:
            while not self._stop.is_set():
                batch: list[Any] = []
                for is_control, item in rb.pop_many():
                    if is_control and (item is _END or type(item) is _Error):
                        if batch:
                            self._put(q, batch)
                        self._put(q, item)
                        return
                    if is_control:
                        batch.append(item)
                    else:
                        batch.extend(item)
                if batch and not self._put(q, batch):
                    return
        except ReorderBufferClosed:
            return
        except BaseException as exc:
            self._put(q, _Error(exc))


def _completer(rb: ReorderBuffer, seq: int, step_name: str) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        try:
            result = future.result()
        except ZephonError as exc:
            rb.fail(seq, exc)
        except BaseException as exc:
            tb = getattr(exc, "remote_traceback", "") or "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__)
            )
            rb.fail(seq, WorkerError(step_name, f"{type(exc).__name__}: {exc}", tb))
        else:
            rb.complete(seq, result)

    return done
