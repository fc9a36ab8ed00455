"""A stream's acknowledgements: how far the consumer confirmed, how far the server sent.

The send window holds a stream back when its consumer is slow (at most ``window`` batches
beyond the last acknowledgement), without holding back other lanes. The window is one
object shared by the serving thread (which waits on it) and the thread reading the
consumer's messages (which updates it or fails the stream). No gRPC here: the service maps
:attr:`AckWindow.error` and :attr:`AckWindow.superseded` to status codes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .ring import Ring


class AckWindow:
    """Highest acknowledged next_seq of one stream, with waiting for the send window."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.sent = start  # one past the last seq handed to the transport
        self.value = start
        self.error: str | None = None
        self.superseded = False  # the error: a newer stream of the same named consumer
        self.closed = False
        self.ring: Ring | None = None  # the shared-memory ring offered to the client, if any
        self._cond = threading.Condition()

    def update(self, next_seq: int) -> None:
        """The consumer acknowledged every batch below ``next_seq``."""
        with self._cond:
            if next_seq > self.value:
                self.value = next_seq
                self._cond.notify_all()

    def unsent_problem(self, next_seq: int) -> str:
        """Why acknowledging ``next_seq`` is refused ('' when it is fine): acknowledging
        batches not sent yet would let the lane run unboundedly ahead."""
        if next_seq <= self.sent:
            return ""
        sent = (
            f"sent seqs {self.start}..{self.sent - 1}"
            if self.sent > self.start
            else f"sent nothing yet (opened at seq {self.start})"
        )
        return (
            f"Ack(next_seq={next_seq}) acknowledges batches not sent yet: this stream {sent}; "
            "acknowledge only batches received"
        )

    def fail(self, message: str, *, superseded: bool = False) -> None:
        """End the stream with ``message`` (the first failure wins)."""
        with self._cond:
            if self.error is None:
                self.error = message
                self.superseded = superseded
            self._cond.notify_all()

    def close(self) -> None:
        """The stream ended: wake the serving thread."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait_for(self, needed: int, active: Callable[[], bool], draining: threading.Event) -> bool:
        """Wait until acks reach ``needed`` (the window has room); False if the stream ended
        (closed, ``active()`` false, or the server draining)."""
        with self._cond:
            while self.value < needed and self.error is None:
                if self.closed or not active() or draining.is_set():
                    return False
                self._cond.wait(0.2)
            return active()
