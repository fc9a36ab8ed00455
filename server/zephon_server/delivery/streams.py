"""The streams of a server: opening a consumer's stream of a lane, its messages, its end.

:class:`Streams` admits streams (a bound on how many are open, none while draining), names
their consumers, and lets a *named* consumer that reopens a lane replace its older stream
(that one may sit on a dead connection keepalive has not closed yet: it must neither hold
the lane back nor make the new start "not yet reachable"). A :class:`LaneStream` ties a
consumer's reader, acknowledgements and message planner together; the transport feeds it
the consumer's messages (:meth:`LaneStream.receive_ack`, :meth:`LaneStream.receive_ring_reply`)
and sends what :meth:`LaneStream.messages` yields.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator

from .acks import AckWindow
from .hub import LaneHub
from .message_planner import Message, MessagePlanner, MessagePolicy

log = logging.getLogger(__name__)


class Streams:
    """Every open stream of one server (see the module docstring)."""

    def __init__(self, hub: LaneHub, policy: MessagePolicy, max_streams: int = 256) -> None:
        self.hub = hub
        self.policy = policy
        self.max_streams = max_streams
        self.draining = threading.Event()
        self._lock = threading.Lock()
        self._count = 0
        self._ids = itertools.count()
        self._named: dict[tuple[int, str], tuple[str, AckWindow]] = {}  # (lane, name) -> stream

    @property
    def active(self) -> int:
        """Streams open now."""
        return self._count

    def admit(self) -> bool:
        """Count a new stream in; False (nothing counted) at the limit."""
        with self._lock:
            if self._count >= self.max_streams:
                return False
            self._count += 1
            return True

    def leave(self) -> None:
        """A stream :meth:`admit` counted in ended."""
        with self._lock:
            self._count -= 1

    def open(
        self,
        lane: int,
        start: int,
        *,
        name: str,
        peer: str,
        per_message: int,
        shared_memory: bool,
    ) -> LaneStream:
        """A stream of ``lane`` from ``start`` for consumer ``name`` (else the peer address).
        Raises what :meth:`LaneHub.open` raises (OutOfRange, BadLane, ReplayLimit...)."""
        consumer = f"{name or peer}#{next(self._ids)}"
        acks = AckWindow(start)
        if name:
            with self._lock:
                previous = self._named.get((lane, name))
                self._named[(lane, name)] = (consumer, acks)
            if previous is not None:
                old_consumer, old_acks = previous
                old_acks.fail(
                    f"superseded: consumer {name!r} opened lane {lane} again on another "
                    "stream (consumers of one lane need distinct names)",
                    superseded=True,
                )
                self.hub.close_consumer(lane, old_consumer)
        try:
            reader = self.hub.open(lane, consumer, start)
        except BaseException:
            self._forget(lane, name, consumer)
            raise
        planner = MessagePlanner(
            reader,
            acks,
            self.policy,
            lane=lane,
            per_message=per_message,
            shared_memory=shared_memory,
            draining=self.draining,
        )
        return LaneStream(self, lane, name, consumer, acks, planner)

    def _forget(self, lane: int, name: str, consumer: str) -> None:
        with self._lock:
            entry = self._named.get((lane, name))
            if entry is not None and entry[0] == consumer:
                del self._named[(lane, name)]


class LaneStream:
    """One consumer's open stream of a lane. Made by :meth:`Streams.open`."""

    def __init__(
        self,
        streams: Streams,
        lane: int,
        name: str,
        consumer: str,
        acks: AckWindow,
        planner: MessagePlanner,
    ) -> None:
        self._streams = streams
        self._hub = streams.hub
        self.lane = lane
        self.name = name
        self.consumer = consumer
        self.acks = acks
        self.planner = planner
        self.failure: BaseException | None = None  # why the stream broke (set by the transport)

    def messages(self, active: Callable[[], bool]) -> Iterator[Message]:
        """What to send, in order, until the lane ends or the stream stops."""
        return self.planner.messages(active)

    def release(self) -> None:
        """The call ended (cancelled, or the transport is done): wake a serving thread blocked
        in the hub for a batch and stop holding the lane back."""
        self.acks.close()
        self._hub.close_consumer(self.lane, self.consumer)

    def close(self) -> None:
        """After the last message: release the stream, its ring and its consumer name."""
        self.acks.close()
        if self.acks.ring is not None:
            self.acks.ring.close()
        self._hub.close_consumer(self.lane, self.consumer)
        self._streams._forget(self.lane, self.name, self.consumer)

    def receive_ack(self, next_seq: int) -> bool:
        """The consumer acknowledged every batch below ``next_seq``; False: the stream failed
        (an ack of unsent batches, or failed earlier) and reads no further messages."""
        problem = self.acks.unsent_problem(next_seq)
        if problem:
            self.acks.fail(problem)
        if self.acks.error is not None:
            self._hub.close_consumer(self.lane, self.consumer)  # wakes a stream waiting in the hub
            return False
        self._hub.ack(self.lane, self.consumer, next_seq)
        self.acks.update(next_seq)
        return True

    def receive_ring_reply(self, accepted: bool, reason: str, problem: str = "") -> bool:
        """The consumer's answer to the ring offer (``problem``: why the transport refused
        the message, '' if it is well-formed); False as :meth:`receive_ack`."""
        ring = self.acks.ring
        if problem:
            self.acks.fail(problem)
        elif ring is None or ring.answered:
            self.acks.fail(
                "RingReply without a RingOffer to answer: send one only after the server "
                "offered a ring, and only once"
            )
        else:
            ring.answer(accepted, reason)
            return True
        return self.reject(None)

    def reject(self, message: str | None) -> bool:
        """Fail the stream with ``message`` (a consumer message not allowed here) or with the
        failure already recorded; always False."""
        if message is not None:
            self.acks.fail(message)
        self._hub.close_consumer(self.lane, self.consumer)
        return False

    def abandon(self) -> None:
        """The consumer's messages broke off unexpectedly (e.g. one did not decode): end the
        stream, which may be waiting in the hub for the lane's next batch."""
        log.debug("ack reader for lane %d ended", self.lane, exc_info=True)
        self._hub.close_consumer(self.lane, self.consumer)
