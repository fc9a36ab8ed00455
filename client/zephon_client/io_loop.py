"""The client's I/O thread: one asyncio event loop running every ``StreamBatches`` call.

All lanes of all :class:`~zephon_client.DataClient` objects in a process are read by one
daemon thread (``zephon-client-io``) running ``grpc.aio`` calls, rather than by a reader
thread per lane on top of the synchronous gRPC API. Each received batch then costs one
wake-up of the consumer instead of a chain of thread hand-offs (the gRPC polling thread, the
call's condition variable, a reader thread, a queue), which costs markedly less client CPU
per batch (measured in ``docs/decisions.md``, "The client reads streams on one asyncio thread").

The loop starts on first use. A forked child starts its own on first use: threads do not
survive ``fork``, so a client must be created in the process that uses it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    """The running I/O loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            ready = threading.Event()
            new = asyncio.new_event_loop()

            def run() -> None:
                new.set_exception_handler(_exception_handler)
                asyncio.set_event_loop(new)
                new.call_soon(ready.set)
                new.run_forever()

            threading.Thread(target=run, name="zephon-client-io", daemon=True).start()
            ready.wait()
            _loop = new
        return _loop


def _exception_handler(event_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The default handler, minus grpc.aio's spurious wake-up errors.

    When another thread of the process runs its own ``grpc.aio`` loop, gRPC wakes every loop
    bound to its completion queue and all but one find nothing to read: ``BlockingIOError``
    from ``PollerCompletionQueue._handle_events``, harmless (grpc/grpc#25364). This loop runs
    no socket code of its own, so that error can only be that one.
    """
    if isinstance(context.get("exception"), BlockingIOError):
        logger.debug("ignored a spurious grpc.aio poller wake-up: %s", context.get("message"))
        return
    event_loop.default_exception_handler(context)


def _forget_loop_after_fork() -> None:
    global _loop, _lock
    _lock = threading.Lock()
    _loop = None  # its thread did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop_after_fork)


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run ``coro`` on the I/O loop; its result arrives in the returned future."""
    return asyncio.run_coroutine_threadsafe(coro, loop())


def call(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` on the I/O loop soon (from any thread)."""
    loop().call_soon_threadsafe(fn, *args)


def run(fn: Callable[[], Awaitable[T] | T], timeout: float | None = None) -> T:
    """Call ``fn`` on the I/O loop and wait for its result (awaited if it is awaitable)."""

    async def wrapper() -> T:
        result = fn()
        if isinstance(result, Awaitable):
            return await result  # type: ignore[no-any-return]
        return result

    return submit(wrapper()).result(timeout)


class Mailbox(Generic[T]):
    """A bounded hand-off from coroutines on the I/O loop to one consuming thread.

    :meth:`put` (on the loop) waits while ``maxsize`` items are queued, without blocking the
    loop; :meth:`get` (in the consumer's thread) blocks until an item arrives.
    :meth:`put_nowait` ignores the bound (wake-ups and final items); after :meth:`discard`,
    :meth:`put` drops its items.
    """

    def __init__(self, maxsize: int) -> None:
        self._maxsize = max(1, maxsize)
        self._items: collections.deque[T] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._space: asyncio.Future[None] | None = None  # the loop waits on it while full
        self._discard = False

    async def put(self, item: T) -> None:
        while True:
            with self._cond:
                if self._discard:
                    return
                if len(self._items) < self._maxsize:
                    self._items.append(item)
                    self._cond.notify()
                    return
                space = self._space = asyncio.get_running_loop().create_future()
            await space

    def discard(self) -> None:
        """From now on :meth:`put` drops its item at once (the consumer is leaving)."""
        with self._cond:
            self._discard = True
            space, self._space = self._space, None
        if space is not None:
            space.get_loop().call_soon_threadsafe(_resolve, space)

    def put_nowait(self, item: T) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def get(self, timeout: float | None = None) -> T:
        """The next item; ``queue.Empty`` after ``timeout`` seconds without one."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items, timeout):
                raise queue.Empty
            item = self._items.popleft()
            space, self._space = self._space, None
        if space is not None:
            space.get_loop().call_soon_threadsafe(_resolve, space)
        return item


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
