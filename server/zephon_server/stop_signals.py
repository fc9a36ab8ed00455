"""SIGTERM and SIGINT for ``zephon serve``, from its first moment to its drain.

The command line installs :class:`StopSignals` before its heavy imports. Until the server hands
the signals over (:meth:`StopSignals.hand_over`, once it has loaded the pipeline and bound its
port, before it starts threads and worker processes) a signal raises
:class:`StartupInterrupted` in the main thread: the start-up unwinds the way Ctrl-C unwinds a
script, nothing is left running, and the command exits 0. After the hand-over a signal calls the
server's handler (a drain). A signal is never the default action (status -15) once installed.

The allocator's re-execution (``runtime/allocator.py``) runs with the signals blocked
(:meth:`StopSignals.blocked`): a blocked signal stays pending across ``exec``, and the new
image takes it as soon as it installs its own handlers.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop the server."""


class StartupInterrupted(BaseException):
    """A stop signal arrived while the server was starting.

    A ``BaseException`` like ``KeyboardInterrupt``, so code that catches ``Exception`` does
    not swallow it.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


class StopSignals:
    """The stop signals' handler: interrupt the start-up, then call the server's handler."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._handler: Callable[[int], None] | None = None

    @classmethod
    def install(cls) -> StopSignals:
        """Handle the stop signals from now on (main thread only); unblocks them, since a
        re-executed process inherits them blocked, and a pending one is taken at once."""
        stop = cls()
        for signum in SIGNALS:
            signal.signal(signum, stop._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        return stop

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        handler = self._handler
        if handler is None:
            raise StartupInterrupted(signum)
        handler(signum)

    def hand_over(self, handler: Callable[[int], None]) -> None:
        """From now on a signal calls ``handler(signum)`` instead of interrupting. A signal
        already received is handed over at once: its :class:`StartupInterrupted` can be lost
        when it is raised where Python only prints exceptions (an import lock's weakref
        callback, a ``__del__``), and the start-up then went on to serve, its stop forgotten
        (a server that never exited)."""
        self._handler = handler
        if self.received is not None:
            handler(self.received)

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """Hold the stop signals back for the block (pending ones are taken after it)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
