"""The Ray runner: a step's ``process_many`` calls run on Ray actors.

Stages of operators added with ``placement="remote"`` run here, and so do the map-like
(fusable) stages when ``execution.runner`` is ``ray``. The skeleton is the pooled runner's
(:mod:`.base`): the accumulator runs serially in this process, micro-batches get sequence
numbers and their results go through the same reorder buffer, so the output equals
``inline``'s. Only where ``Step.run`` executes differs:

* **Actors.** Each step gets ``step.workers`` actors. An actor receives the step's operators
  (pickled once, with Ray's cloudpickle) and runs every operator's ``setup()`` with the
  plan's :class:`~zephon_server.engine.ops.OpContext` before any data arrives. A task goes to
  the actor with the fewest tasks in flight (round-robin on ties).
* **By value.** Micro-batches travel as pickled bytes through Ray's object store, both ways:
  results arrive as ordinary writable arrays that pin nothing in the object store (no
  shared-memory handles, unlike the processes runner).
* **Failures.** An operator raising is deterministic: the run fails with the
  :class:`~zephon_server.engine.errors.WorkerError` naming it, never retried. A task lost to
  the infrastructure (the actor process died or was killed, its node was lost) is retried on
  another actor, and the dead actor is replaced (its operators set up again); because
  ``process_many`` is stateless the result is the same. After :data:`MAX_RETRIES` retries
  of one micro-batch the run fails with a ``WorkerError`` saying so.
* **Tuning.** Each actor applies the execution's ``worker_tuning`` before it loads its
  operators, as process workers do.
* **Ray itself.** If this process is already connected to Ray (``ray.init`` called by the
  application), that connection is used as it is. Otherwise the address is, in order:
  ``execution.ray_address`` (the ``zephon`` command sets it from ``$ZEPHON_RAY_ADDRESS`` when
  that is set), Ray's own ``$RAY_ADDRESS`` (Ray reads it); with none a
  private local Ray is started (``num_cpus`` = this machine's cores, a small object store,
  no dashboard) and shut down when the last Ray stage of the process closes.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .. import shm
from ..errors import ConfigError, WorkerError, ZephonError
from ..execution import WorkerTuning
from .base import PooledRunner
from .steps import Step, Task

log = logging.getLogger(__name__)

try:  # Ray is an optional extra: pip install 'zephon-service[ray]'
    import ray
    from ray import exceptions as ray_exceptions
except ImportError:  # pragma: no cover - CI installs the extra
    ray = None  # type: ignore[assignment]
    ray_exceptions = None  # type: ignore[assignment]

#: Retries of one micro-batch after infrastructure failures, each on another actor.
MAX_RETRIES = 3
#: Object store of a private local Ray (results travel by value and are freed at once).
LOCAL_OBJECT_STORE_BYTES = 256 << 20


# --------------------------------------------------------------------------------------------
# The actor
# --------------------------------------------------------------------------------------------


class StepWorker:
    """Runs one step's operators inside a Ray actor (wrapped with ``ray.remote`` lazily).

    ``sys_path`` is the driver's import path: entries missing here are appended before the
    operators are unpickled, so operators defined in the application's own modules load on
    a local Ray. A failure to load or set up an operator is kept and raised by every
    :meth:`run`: it is deterministic, so retrying on another actor would not help.
    """

    def __init__(
        self,
        sys_path: list[str],
        step_bytes: bytes,
        contexts: list[Any],
        tuning: WorkerTuning | None = None,
    ) -> None:
        for entry in sys_path:
            if entry not in sys.path and (not entry or os.path.isdir(entry)):
                sys.path.append(entry)
        self.error: WorkerError | None = None
        self.step: Step | None = None
        name = "operators"
        try:
            if tuning is not None:
                name = "worker_tuning"
                tuning.apply_in_worker()
                name = "operators"
            step = pickle.loads(step_bytes)
            for op, ctx in zip(step.ops, contexts):
                name = op.op_name
                ctx.worker_id = os.getpid()
                op.setup(ctx)
            self.step = step
        except Exception as exc:
            self.error = WorkerError(
                name,
                f"cannot set up on a Ray worker: {type(exc).__name__}: {exc}",
                traceback.format_exc(),
            )

    def run(self, elems_bytes: bytes) -> bytes:
        """``Step.run`` on a pickled micro-batch; the pickled ``(result, seconds)``."""
        if self.error is not None:
            raise self.error
        assert self.step is not None
        started = time.perf_counter()
        result = self.step.run(pickle.loads(elems_bytes))
        seconds = time.perf_counter() - started
        return pickle.dumps((result, seconds), protocol=pickle.HIGHEST_PROTOCOL)


_REMOTE_WORKER: Any = None


def _remote_worker() -> Any:
    global _REMOTE_WORKER
    if _REMOTE_WORKER is None:
        _REMOTE_WORKER = ray.remote(StepWorker)
    return _REMOTE_WORKER


# --------------------------------------------------------------------------------------------
# The process's connection to Ray
# --------------------------------------------------------------------------------------------


def ray_address(configured: str | None) -> str | None:
    """The address to connect to: ``execution.ray_address`` (the ``zephon`` command puts
    ``$ZEPHON_RAY_ADDRESS`` there), else None."""
    return configured or None


class _Session:
    """Reference-counted connection to Ray shared by every Ray stage of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._owned = False

    def acquire(self, address: str | None) -> None:
        with self._lock:
            if not ray.is_initialized():
                self._init(address)
                self._owned = True
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0 or not self._owned:
                return
            self._owned = False
            if ray.is_initialized():
                log.info("shutting down the local Ray started for this run")
                ray.shutdown()

    @staticmethod
    def _init(address: str | None) -> None:
        # No phoning home from a data loader; the caller's environment may say otherwise.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "ignore_reinit_error": True,
            "logging_level": logging.WARNING,
        }
        if address in (None, "local") and not (address is None and os.environ.get("RAY_ADDRESS")):
            # A private local Ray ("local" never attaches to another instance on this host).
            kwargs.update(
                address="local",
                num_cpus=os.cpu_count() or 1,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            )
            where = "a local Ray"
        else:
            kwargs["address"] = address
            where = f"Ray at {address or os.environ.get('RAY_ADDRESS')}"
        started = time.monotonic()
        if kwargs["address"] == "local":
            _init(kwargs, where)  # starting Ray here answers or fails by itself
        else:
            _init_within(kwargs, where, connect_timeout(os.environ))
        log.info("connected to %s in %.1f s", where, time.monotonic() - started)


#: Seconds ``ray.init`` may take before the run fails (``$ZEPHON_RAY_CONNECT_TIMEOUT``).
DEFAULT_CONNECT_TIMEOUT_S = 120.0


def connect_timeout(environ: Any) -> float:
    """``$ZEPHON_RAY_CONNECT_TIMEOUT`` (seconds > 0), else :data:`DEFAULT_CONNECT_TIMEOUT_S`."""
    text = environ.get("ZEPHON_RAY_CONNECT_TIMEOUT")
    if text is None:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(
            f"ZEPHON_RAY_CONNECT_TIMEOUT must be a number of seconds > 0, got {text!r}"
        )
    return value


def _init(kwargs: dict[str, Any], where: str) -> None:
    try:
        ray.init(**kwargs)
    except Exception as exc:
        raise ConfigError(f"cannot start or connect to {where}: {exc}") from exc


def _init_within(kwargs: dict[str, Any], where: str, timeout: float) -> None:
    """``ray.init(**kwargs)`` for an existing cluster, failing after ``timeout`` seconds:
    given a ``host:port`` that does not answer, Ray waits for its control store without end (a
    run looked alive and made nothing). The call runs on :data:`_CONNECTOR`."""
    done = _CONNECTOR.submit(functools.partial(ray.init, **kwargs))
    try:
        done.result(timeout)
    except TimeoutError:
        raise ConfigError(
            f"cannot start or connect to {where}: no answer within {timeout:g} s (check the "
            "address, that the cluster is up and reachable from here; "
            "ZEPHON_RAY_CONNECT_TIMEOUT sets this wait)"
        ) from None
    except Exception as exc:
        raise ConfigError(f"cannot start or connect to {where}: {exc}") from exc


class _Connector:
    """One daemon thread that makes every ``ray.init`` call of the process, for the life of
    the process: a call that never returns must not keep the process from exiting (a
    ``ThreadPoolExecutor``'s threads are joined at exit), processes Ray starts may be bound to
    the thread that started them (told to exit when it does), and a thread per connection
    would pile up over the ``Resume`` calls of a long-lived server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        done: Future[Any] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="zephon-ray-init", daemon=True
                )
                self._thread.start()
        self._calls.put((call, done))
        return done

    def _serve(self) -> None:
        while True:
            call, done = self._calls.get()
            try:
                done.set_result(call())
            except BaseException as exc:  # handed to the caller
                done.set_exception(exc)


_CONNECTOR = _Connector()


SESSION = _Session()


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


class _Pool:
    """The actors of one step, with their in-flight task counts."""

    def __init__(
        self, step: Step, step_bytes: bytes, contexts: list[Any], tuning: WorkerTuning | None
    ) -> None:
        self.step = step
        self.step_bytes = step_bytes
        self.contexts = contexts
        self.tuning = tuning
        self.lock = threading.Lock()
        self.actors: list[Any] = [self._new_actor() for _ in range(step.workers)]
        self.inflight = [0] * step.workers
        self.next = 0
        self.replaced = 0

    @property
    def op_name(self) -> str:
        return self.step.head.op_name if len(self.step.ops) == 1 else self.step.name

    def _new_actor(self) -> Any:
        return (
            _remote_worker()
            .options(
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy="SPREAD",
            )
            .remote(list(sys.path), self.step_bytes, self.contexts, self.tuning)
        )

    def pick(self, avoid: int | None) -> tuple[int, Any]:
        """The least-loaded actor (round-robin on ties), other than ``avoid`` if possible."""
        with self.lock:
            n = len(self.actors)
            if not n:
                raise ZephonError("the Ray runner was closed")
            order = [(self.next + k) % n for k in range(n)]
            if avoid is not None and n > 1:
                order.remove(avoid)
            slot = min(order, key=lambda i: self.inflight[i])
            self.next = (slot + 1) % n
            self.inflight[slot] += 1
            return slot, self.actors[slot]

    def done(self, slot: int) -> None:
        with self.lock:
            self.inflight[slot] = max(0, self.inflight[slot] - 1)

    def replace(self, slot: int, actor: Any) -> None:
        """Replace the dead ``actor`` of ``slot`` (once, however many of its tasks failed)."""
        with self.lock:
            if self.actors[slot] is not actor:
                return
            self.actors[slot] = self._new_actor()
            self.replaced += 1
        log.warning("%s: Ray actor %d died; replaced it", self.op_name, slot)
        _kill(actor)

    def kill(self) -> None:
        with self.lock:
            actors, self.actors = self.actors, []
        for actor in actors:
            _kill(actor)


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already dead, or Ray is gone
        log.debug("ray.kill failed", exc_info=True)


class _Attempt:
    """One micro-batch on its way through the actors of a step (retries included)."""

    __slots__ = ("actor", "data", "number", "outer", "pool", "slot")

    def __init__(self, pool: _Pool, data: bytes, outer: Future[list[Any]]) -> None:
        self.pool = pool
        self.data = data
        self.outer = outer
        self.number = 0  # retries so far
        self.slot = -1
        self.actor: Any = None

    def deliver(self, f: Future[Any]) -> None:
        result, seconds = pickle.loads(f.result())
        self.pool.step.timing.observe(seconds)
        self.outer.set_result(result)

    def fail(self, exc: BaseException) -> None:
        if not self.outer.done():
            self.outer.set_exception(exc)

    def guarded(self, fn: Callable[[Future[Any]], None], f: Future[Any]) -> None:
        """``fn(f)``, failing the micro-batch rather than losing it if that raises."""
        try:
            fn(f)
        except BaseException as exc:
            self.fail(
                WorkerError(
                    self.pool.op_name, f"{type(exc).__name__}: {exc}", traceback.format_exc()
                )
            )


class RayRunner(PooledRunner):
    """A pooled runner whose workers are Ray actors (see the module docstring)."""

    kind = "ray"
    max_retries = MAX_RETRIES

    def __init__(
        self, *args: Any, plan: Any, extras: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if ray is None:
            raise ConfigError(
                "the Ray runner (placement='remote' or runner 'ray') needs Ray: "
                "pip install 'zephon-service[ray]'"
            )
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.extras = extras or {}
        self._pools: dict[int, _Pool] = {}
        self._failures = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zephon-ray-retry")
        self._session = False
        self._pool_lock = threading.Lock()
        self.retries = 0
        # Connect now, on the thread building the run (the main thread of `zephon dump`),
        # rather than on a runner thread once data flows.
        self._connect()

    def _connect(self) -> None:
        SESSION.acquire(ray_address(getattr(self.plan.execution, "ray_address", None)))
        self._session = True

    @property
    def actors_replaced(self) -> int:
        """Dead actors replaced so far (every step)."""
        return sum(pool.replaced for pool in self._pools.values())

    def start_pool(self) -> None:
        with self._pool_lock:
            if self._stop.is_set() or self._pools:
                return
            if not self._session:
                self._connect()
        op_index = {id(op): i for i, op in enumerate(self.plan.ops)}
        cloudpickle = ray.cloudpickle
        for d in self.drivers:
            step = d.step
            if step.workers == 0:
                continue  # runs in its driver thread
            contexts = [
                self.plan.context(op, op_index[id(op)], extras=self.extras) for op in step.ops
            ]
            try:
                step_bytes = cloudpickle.dumps(step)
            except Exception as exc:
                raise ConfigError(
                    f"{step.name}: cannot send the operator to Ray workers "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            tuning = self.plan.execution.worker_tuning
            self._pools[step.index] = _Pool(step, step_bytes, contexts, tuning)

    def submit(self, task: Task) -> Future[list[Any]]:
        outer: Future[list[Any]] = Future()
        pool = self._pools[task.step.index]
        try:
            # Payloads from a processes stage arrive as shared-memory handles: resolve them here.
            data = pickle.dumps(shm.resolve_payloads(task.elems), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            outer.set_exception(WorkerError(pool.op_name, f"cannot serialize a micro-batch: {exc}"))
            return outer
        self._send(_Attempt(pool, data, outer), avoid=None)
        return outer

    def _send(self, attempt: _Attempt, avoid: int | None) -> None:
        """Send the micro-batch to an actor; its completion comes back through ``relay``."""
        if self._stop.is_set():
            attempt.fail(ZephonError("the Ray runner was closed"))
            return
        pool = attempt.pool
        try:
            attempt.slot, attempt.actor = pool.pick(avoid)
        except ZephonError as exc:
            attempt.fail(exc)
            return
        try:
            inner = attempt.actor.run.remote(attempt.data).future()
        except Exception as exc:  # Ray is gone (shutdown) or refused the call
            pool.done(attempt.slot)
            attempt.fail(
                WorkerError(pool.op_name, f"cannot submit to Ray: {type(exc).__name__}: {exc}")
            )
            return

        def relay(f: Future[Any]) -> None:
            # Runs on a Ray thread, which must neither block nor call back into Ray (creating
            # or killing actors there hangs): failures are handled on the runner's own thread.
            pool.done(attempt.slot)
            if f.exception() is None:
                attempt.guarded(attempt.deliver, f)
                return
            try:
                self._failures.submit(attempt.guarded, functools.partial(self._failed, attempt), f)
            except RuntimeError:  # the runner is closing
                attempt.fail(ZephonError("the Ray runner was closed"))

        inner.add_done_callback(relay)

    def _failed(self, attempt: _Attempt, f: Future[Any]) -> None:
        """Surface a deterministic failure, or retry an infrastructure one elsewhere."""
        exc = f.exception()
        assert exc is not None
        pool = attempt.pool
        if self._stop.is_set():
            attempt.fail(ZephonError("the Ray runner was closed"))
            return
        if isinstance(exc, ray_exceptions.RayTaskError):
            # The operator (or its setup) raised: deterministic, never retried.
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ZephonError):
                attempt.fail(cause)
            else:
                tb = getattr(exc, "traceback_str", "") or ""
                attempt.fail(WorkerError(pool.op_name, f"{type(cause).__name__}: {cause}", tb))
            return
        if isinstance(exc, ray_exceptions.RayActorError) and exc.actor_init_failed:
            # The actor could not even be constructed here (e.g. its code does not import).
            attempt.fail(WorkerError(pool.op_name, f"cannot start a Ray actor: {exc}"))
            return
        if not isinstance(exc, ray_exceptions.RayError):
            attempt.fail(exc)
            return
        # Lost to the infrastructure: the actor died or was killed, an object was lost.
        if isinstance(exc, ray_exceptions.RayActorError):
            pool.replace(attempt.slot, attempt.actor)
        summary = _summary(exc)
        if attempt.number >= self.max_retries:
            attempt.fail(
                WorkerError(
                    pool.op_name,
                    f"a micro-batch failed on {attempt.number + 1} Ray actors in a row "
                    f"(retried {attempt.number} times); the run cannot continue. "
                    f"Last error: {summary}",
                )
            )
            return
        with self._pool_lock:
            self.retries += 1
        attempt.number += 1
        log.warning(
            "%s: Ray task failed (%s); retrying on another actor (retry %d of %d)",
            pool.op_name,
            summary,
            attempt.number,
            self.max_retries,
        )
        self._send(attempt, avoid=attempt.slot)

    def stop_pool(self) -> None:
        self._failures.shutdown(wait=False, cancel_futures=True)
        for pool in self._pools.values():
            pool.kill()
        with self._pool_lock:
            if self._session:
                self._session = False
                SESSION.release()


def _summary(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"
