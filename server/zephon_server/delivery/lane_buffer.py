"""A lane's buffer in the hub: its recent batches, its consumers and their positions.

The buffer holds one contiguous run of batches (``first_seq`` to ``kept_end``), possibly
followed by a *gap* of batches the hub did not keep (up to ``next_seq``, the next seq the run
produces): see :mod:`.hub`. Live consumers hold the buffer back (``slowest``); consumers
reading a replay count only for the lane's acknowledged ``position``. Plain data guarded by
the hub's lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..engine.numbered_batch import NumberedBatch
from ..engine.run import EndOfLane
from .replays import SharedReplay

#: Consumer names a lane remembers the position of (GetInfo for a consumer, see
#: :meth:`LaneBuffer.remember`); the oldest is forgotten past it.
MAX_KNOWN = 1024


@dataclass
class LaneBuffer:
    """One lane's batches and consumers in the hub (see the module docstring)."""

    lane: int
    start_seq: int  # first seq this run can produce (resume position)
    batches: deque[NumberedBatch] = field(default_factory=deque)
    next_seq: int = 0  # next seq the producer will add
    end: EndOfLane | None = None
    consumers: dict[str, int] = field(default_factory=dict)  # consumer -> acked next_seq
    replaying: dict[str, SharedReplay] = field(default_factory=dict)  # consumers in replays
    replay_acked: dict[str, int] = field(default_factory=dict)  # their acked next_seq
    acked: int = 0
    #: consumer -> where it last acknowledged (or opened) in this run, kept after it leaves
    #: (:meth:`remember`; the most recent :data:`MAX_KNOWN` names).
    known: dict[str, int] = field(default_factory=dict)
    waiting: int = 0  # readers and checkpoints waiting for this lane's next batches
    held_s: float = 0.0  # seconds the producer waited because this lane's log was full
    dropped: int = 0  # batches not kept (the log was full while another lane waited)
    dropping: bool = False  # the last batch was not kept

    def stats(self, made: int, cut: int, end: int | None) -> dict[str, Any]:
        """The lane's figures for metrics; ``made`` and ``cut``: the batches it made and
        had cut at the common end ``end`` (:mod:`.end_gate`; 0, 0 and None without one)."""
        slowest = self.slowest()
        return {
            # Every batch the lane made, cut ones too (they are never kept, so the log's next
            # seq stops at the end); unconsumed counts what a reader can still take: a cut
            # batch is never acknowledged.
            "produced": max(self.next_seq, made),
            "acked": slowest,
            "unconsumed": max(
                0, (self.next_seq if end is None else min(self.next_seq, end)) - slowest
            ),
            "buffered": len(self.batches),
            "consumers": len(self.consumers) + len(self.replaying),
            "replay_readers": len(self.replaying),
            "held_back_s": self.held_s,
            "not_kept": self.dropped,
            "ended": self.end is not None,
            "cut": cut,
        }

    def remember(self, consumer: str, next_seq: int) -> None:
        """``consumer``'s position on this lane is ``next_seq`` (the latest name last). A
        stream's consumer is ``<name>#<stream id>`` (:mod:`.streams`): the name is kept."""
        name = consumer.rpartition("#")[0] or consumer
        known = self.known
        known.pop(name, None)
        known[name] = next_seq
        if len(known) > MAX_KNOWN:
            del known[next(iter(known))]

    @property
    def first_seq(self) -> int:
        return self.batches[0].seq if self.batches else self.next_seq

    @property
    def kept_end(self) -> int:
        """One past the last kept batch; below ``next_seq`` while the log has a gap."""
        return self.batches[-1].seq + 1 if self.batches else self.next_seq

    def holds(self, seq: int) -> bool:
        """Whether a reader at ``seq`` reads the log: it has the batch, or will add it."""
        return self.first_seq <= seq < self.kept_end or seq >= self.next_seq == self.kept_end

    def slowest(self) -> int:
        """The live log's slowest consumer (replay readers do not hold it back)."""
        return min(self.consumers.values()) if self.consumers else self.acked

    def position(self) -> int:
        """The acknowledged position of the lane: its slowest consumer, replays included."""
        acked = [*self.consumers.values(), *self.replay_acked.values()]
        return min(acked) if acked else self.acked

    def item(self, seq: int) -> NumberedBatch | EndOfLane | None:
        """Batch ``seq`` from the log, the lane's end past its last batch, or None."""
        if self.first_seq <= seq < self.kept_end:
            return self.batches[seq - self.first_seq]
        if self.end is not None and seq >= self.end.next_seq:
            return self.end
        return None

    def evict(self, keep_consumed: int) -> None:
        """Drop the batches every live consumer is ``keep_consumed`` past; the whole run
        before a gap once no live consumer reads it (the log then starts afresh)."""
        slowest = self.slowest()
        keep_from = slowest - keep_consumed
        if self.kept_end < self.next_seq and slowest >= self.kept_end:
            keep_from = self.kept_end
        while self.batches and self.batches[0].seq < keep_from:
            self.batches.popleft()
