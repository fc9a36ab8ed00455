"""The processes runner: each step's ``process_many`` calls run in worker processes.

Workers are started with the ``spawn`` method. Each receives the step's operators (pickled
once, at start) and the execution's ``worker_tuning`` (applied first: the server's garbage
collector policy and malloc arenas), and runs ``setup()`` in the worker before any data
arrives. Array payloads
come back through shared memory as lazy handles (:mod:`..shm`). A worker that dies fails
the run with a :class:`WorkerError` naming the operator and the exit code; it never hangs.

Workers never outlive the process that runs them: each watches that process's lifeline
(:mod:`.lifeline`) and exits when it breaks, however the process died (SIGKILL included),
which also lets multiprocessing's resource tracker exit and unlink what is registered with
it. Payload blocks and the pools' semaphores are attributed to their owner
(:mod:`..shm_owner`), so a later start-up removes those a killed tracker left behind.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import Any

from .. import shm, shm_owner
from ..errors import WorkerError
from ..execution import WorkerTuning
from ..storage.metrics import storage_stats
from . import lifeline
from .base import PooledRunner
from .steps import Step, Task

log = logging.getLogger(__name__)

_WORKER_STEPS: dict[int, Step] = {}


def _init_worker(
    steps: list[Step],
    contexts: list[list[Any]],
    line: Connection,
    owner_pid: int,
    owner: str | None,
    tuning: WorkerTuning | None,
) -> None:
    """Worker initializer: watch the owning process's lifeline first (exit if it is gone),
    name payload blocks after its owner id, apply the process tuning, keep the steps and run
    every operator's setup.

    A worker ignores SIGINT: a terminal's Ctrl-C goes to the whole process group, and the
    owning process stops its workers itself (its run's close, or the lifeline). The signal
    was blocked from the worker's first instruction (:func:`_sigint_blocked` around the
    submit that spawned it), so one arriving while the interpreter started waits here and
    is dropped, instead of a ``KeyboardInterrupt`` traceback per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    lifeline.watch(line, owner_pid)
    shm_owner.adopt(owner)
    if tuning is not None:
        tuning.apply_in_worker()
    for step, ctxs in zip(steps, contexts):
        for op, ctx in zip(step.ops, ctxs):
            ctx.worker_id = os.getpid()
            op.setup(ctx)
        _WORKER_STEPS[step.index] = step


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in the calling thread (a signal arriving meanwhile is delivered after):
    processes spawned meanwhile inherit the mask (:func:`_init_worker`)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _initargs(
    steps: list[Step], contexts: list[list[Any]], owner: str | None, tuning: WorkerTuning | None
) -> tuple[Any, ...]:
    """The arguments of :func:`_init_worker` for a worker of this process."""
    return (steps, contexts, lifeline.lifeline(), os.getpid(), owner, tuning)


def _run_task(step_index: int, elems: list[Any]) -> tuple[list[Any], float, Any]:
    """Run a task in a worker; returns its results, its time and the object-store requests
    the worker counted since its last task (added to the owning process's counters)."""
    step = _WORKER_STEPS[step_index]
    started = time.perf_counter()
    result = step.run(elems)
    exported = shm.export_results(result)
    return exported, time.perf_counter() - started, storage_stats().take_delta()


#: What a worker's exit code 1 means, added to the error naming it.
RAISED_NOTE = (
    "exit code 1 is an error the worker raised, whose traceback is on standard error; one "
    "raised while the worker starts is often a script that runs the pipeline outside "
    '`if __name__ == "__main__":`, which every spawned worker runs again'
)


class ProcessesRunner(PooledRunner):
    """A pooled runner whose workers are spawned processes."""

    kind = "processes"

    def __init__(
        self, *args: Any, plan: Any, extras: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.extras = extras or {}
        self._pools: dict[int, ProcessPoolExecutor] = {}
        self._procs: dict[int, dict[int, Any]] = {}  # step -> pid -> Process (for exit codes)
        self._notes: dict[int, str] = {}  # step -> death note, computed once

    def start_pool(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        owner = shm_owner.owner_id()  # first in a process: sweeps dead owners' blocks
        semaphores = shm_owner.mapped_semaphores()
        op_index = {id(op): i for i, op in enumerate(self.plan.ops)}
        for d in self.drivers:
            if d.step.workers == 0:
                continue  # runs in its driver thread
            step = d.step
            contexts = [
                [self.plan.context(op, op_index[id(op)], extras=self.extras) for op in step.ops]
            ]
            self._pools[step.index] = ProcessPoolExecutor(
                max_workers=step.workers,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=_initargs([step], contexts, owner, self.plan.execution.worker_tuning),
            )
        # The pools' queues made named semaphores (spawn): list them for a sweep after a crash.
        shm_owner.record_semaphores(shm_owner.mapped_semaphores() - semaphores)

    def submit(self, task: Task) -> Future[list[Any]]:
        pool = self._pools[task.step.index]
        try:
            with _sigint_blocked():  # a worker spawned by this submit starts with it blocked
                inner = pool.submit(_run_task, task.step.index, task.elems)
        except BrokenProcessPool as exc:
            inner = Future()
            inner.set_exception(exc)
        known = self._procs.setdefault(task.step.index, {})
        if len(known) < task.step.workers:
            known.update(getattr(pool, "_processes", None) or {})
        outer: Future[list[Any]] = Future()
        step = task.step

        name = step.head.op_name if len(step.ops) == 1 else step.name

        def relay(f: Future[Any]) -> None:
            # A callback that raised would leave ``outer`` pending and the run waiting for it.
            result = None
            try:
                exc = f.exception()
                if exc is None:
                    result, seconds, storage = f.result()
                    step.timing.observe(seconds)
                    storage_stats().merge(storage)
                    shm.register_results(result)
                    outer.set_result(result)
                elif isinstance(exc, BrokenProcessPool):
                    outer.set_exception(WorkerError(name, self._death_note(step.index)))
                else:
                    outer.set_exception(exc)
            except BaseException as failure:
                if result is not None:  # no one will resolve its blocks: free them now
                    with contextlib.suppress(Exception):
                        shm.discard_results(result)
                if not outer.done():
                    why = f"cannot take in a worker's result: {type(failure).__name__}: {failure}"
                    outer.set_exception(WorkerError(name, why))

        inner.add_done_callback(relay)
        return outer

    def _death_note(self, step_index: int) -> str:
        cached = self._notes.get(step_index)
        if cached is not None:
            return cached  # every pending task of the broken pool gets the same note at once
        procs = self._procs.get(step_index, {})
        deadline = time.monotonic() + 1.0  # one bounded wait in total, not one per worker
        for p in procs.values():
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        # Workers the executor terminated after the crash exit with -SIGTERM; name the others.
        codes = [
            f"pid {pid} exit code {p.exitcode}"
            for pid, p in list(procs.items())
            if p.exitcode not in (None, 0, -15)
        ]
        detail = ", ".join(codes) if codes else "a worker process terminated abruptly"
        note = f"worker process died ({detail}); the run cannot continue"
        if any(p.exitcode == 1 for p in procs.values()):
            note += f"; {RAISED_NOTE}"
        self._notes[step_index] = note
        return note

    def stop_pool(self) -> None:
        # Blocks are released by the run once every stage has stopped (PipelineRun.close):
        # later stages may still hold handles into them.
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
