"""What a stream's next message carries: the one place that decides it.

A stream sends its lane's batches in seq order. Each message carries the first batch the
reader yields and, for a consumer that accepts several (``max_batches_per_message``), the
batches that are produced already, as long as

* the send window allows (seq ``s`` needs acknowledgements up to ``s - window + 1``);
* the consumer takes that many (at most :data:`MAX_BATCHES_PER_MESSAGE`);
* their tensor bytes stay within ``group_max_bytes`` (a lone batch may be larger); the batch
  that does not fit starts the next message.

After the stream's first message it *lingers* up to ``linger`` seconds for the rest of a
burst (the engine makes a lane's batches a chunk at a time, within milliseconds), so the
burst does not cost one message per batch. A consumer on the server's host that asked for
shared memory is offered a ring sized for the window's batches before its first batch; once
it accepted, each message's tensor bytes go into the ring when it has room. None of this
changes which batches a lane delivers, only how they are grouped into messages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..engine.errors import ConfigError
from ..engine.numbered_batch import NumberedBatch
from ..engine.run import EndOfLane
from .acks import AckWindow
from .readers import LaneReader
from .ring import DEFAULT_MAX_MIB, Ring, ring_size

WINDOW = 16
"""Batches a stream may send beyond its consumer's last acknowledgement."""
MAX_BATCHES_PER_MESSAGE = 16
"""The most batches the server puts in one message, whatever the client asks (the window
bounds it too)."""
GROUP_MAX_BYTES = 16 << 20
"""A group takes no further batch past this many bytes of tensor data (a lone batch may be
larger), far below gRPC's message limits on both sides."""
LINGER = 0.015
"""Seconds a stream waits, after its first message, for more batches to group with a ready
one (``--linger-ms``)."""


@dataclass(frozen=True)
class MessagePolicy:
    """How a server's streams group batches into messages (see the module docstring)."""

    window: int = WINDOW
    linger: float = LINGER
    ring_mib: int = DEFAULT_MAX_MIB  # the largest shared-memory ring a stream gets; 0: none
    max_batches: int = MAX_BATCHES_PER_MESSAGE
    group_max_bytes: int = GROUP_MAX_BYTES

    def __post_init__(self) -> None:
        for name in ("window", "max_batches", "group_max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"MessagePolicy.{name} must be an integer >= 1, got {value!r}")
        if not 0 <= self.linger <= 1:
            raise ConfigError(f"MessagePolicy.linger must be 0..1 seconds, got {self.linger!r}")
        if (
            isinstance(self.ring_mib, bool)
            or not isinstance(self.ring_mib, int)
            or self.ring_mib < 0
        ):
            raise ConfigError(
                f"MessagePolicy.ring_mib must be an integer >= 0, got {self.ring_mib!r}"
            )

    def per_message(self, asked: int) -> int:
        """Batches per message for a consumer that asked for ``asked`` (0: one)."""
        return min(max(asked, 1), self.max_batches)


@dataclass(frozen=True)
class Batches:
    """A message of consecutive batches; ``ring_offsets``: each batch's tensor offsets in the
    stream's ring (the bytes are there, not in the message), or None."""

    batches: tuple[NumberedBatch, ...]
    ring_offsets: list[dict[str, int]] | None


@dataclass(frozen=True)
class RingOffered:
    """A message offering the stream's shared-memory ring to the consumer."""

    ring: Ring


@dataclass(frozen=True)
class Ended:
    """The lane's last message: its end (final position, chain, late tombstones)."""

    end: EndOfLane


Message = Batches | RingOffered | Ended


class MessagePlanner:
    """One stream's messages, planned from its reader and its acknowledgements.

    Iterating yields :data:`Message` values until the lane ends or the stream stops (closed,
    failed, ``active()`` false, server draining). Reader errors (hub closed, pipeline failed)
    propagate.
    """

    def __init__(
        self,
        reader: LaneReader,
        acks: AckWindow,
        policy: MessagePolicy,
        *,
        lane: int,
        per_message: int,
        shared_memory: bool,
        draining: threading.Event,
    ) -> None:
        self.reader = reader
        self.acks = acks
        self.policy = policy
        self.lane = lane
        self.per_message = policy.per_message(per_message)
        self.offer_ring = shared_memory and policy.ring_mib > 0
        self.draining = draining
        self._pending: NumberedBatch | None = None  # taken, but past the last message's bytes

    def messages(self, active: Callable[[], bool]) -> Iterator[Message]:
        """The stream's messages (see the class docstring)."""
        acks, start = self.acks, self.acks.start
        sent = start
        while True:
            item = self._next()
            if item is None:
                return
            if isinstance(item, EndOfLane):
                acks.sent = max(acks.sent, item.next_seq)
                yield Ended(item)
                # Keep the call open until the client acknowledged the tail (or left), so
                # the final acknowledgements are recorded.
                acks.wait_for(item.next_seq, active, self.draining)
                return
            if not acks.wait_for(sent - self.policy.window + 1, active, self.draining):
                return
            if acks.error is not None or self.draining.is_set():
                return
            if self.offer_ring:
                self.offer_ring = False
                acks.ring = self._ring(item)
                if acks.ring is not None:
                    yield RingOffered(acks.ring)
            group = self._group(item, linger=sent > start)
            acks.sent = group[-1].seq + 1  # before the client can see (and ack) them
            offsets = None if acks.ring is None else acks.ring.place(group, acks.value)
            yield Batches(tuple(group), offsets)
            sent = group[-1].seq + 1

    def _next(self) -> NumberedBatch | EndOfLane | None:
        """The first item of the next message (blocks); None when the reader ended."""
        if self._pending is not None:
            item, self._pending = self._pending, None
            return item
        return next(self.reader, None)

    def _ring(self, first: NumberedBatch) -> Ring | None:
        """A ring for the send window's batches, sized once the first batch's size is known."""
        in_flight = self.policy.window + 2 * self.per_message
        return Ring.create(self.lane, ring_size(first.nbytes, in_flight, self.policy.ring_mib))

    def _group(self, first: NumberedBatch, *, linger: bool) -> list[NumberedBatch]:
        """``first`` and the produced batches that join it (see the module docstring)."""
        group = [first]
        room = min(self.per_message, self.acks.value + self.policy.window - first.seq) - 1
        if room <= 0:
            return group
        if linger and self.policy.linger > 0:
            self.reader.linger(room, self.policy.linger)
        budget = self.policy.group_max_bytes - first.nbytes
        while len(group) <= room:
            batch = self.reader.poll()
            if batch is None:
                break
            budget -= batch.nbytes
            if budget < 0:
                self._pending = batch  # it starts the next message
                break
            group.append(batch)
        return group
