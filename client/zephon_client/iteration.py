"""The state of one iteration of a :class:`~zephon_client.client.DataClient` over its lanes:
the open lane streams in rotation order, and the batch yielded last (consumed when the caller
asks for the next one)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .stream import LaneStream
from .wire import DecodedBatch


@dataclass(eq=False)
class Iteration:
    """The state of one iteration (one call of ``DataClient.batches``)."""

    epoch: int = -1
    order: list[int] = field(default_factory=list)
    index: int = 0
    streams: dict[int, LaneStream] = field(default_factory=dict)
    superseded: bool = False

    def cancel(self) -> None:
        for stream in list(self.streams.values()):
            stream.cancel()

    def leave(self, timeout: float) -> None:
        """Send every lane's pending Ack and let its call end (``LaneStream.leave``), waiting
        up to ``timeout`` seconds in all for the calls to end (cancelled ones are skipped)."""
        streams = [s for s in list(self.streams.values()) if s.leave()]
        deadline = time.monotonic() + timeout
        for stream in streams:
            stream.join(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 1.0) -> None:
        streams = list(self.streams.values())
        self.streams.clear()
        for stream in streams:
            stream.cancel()
        deadline = time.monotonic() + timeout
        for stream in streams:
            stream.join(max(0.0, deadline - time.monotonic()))


@dataclass(slots=True)
class PendingBatch:
    """The batch yielded last, consumed when the caller asks for the next one."""

    epoch: int
    batch: DecodedBatch
    stream: LaneStream
    run: Iteration
