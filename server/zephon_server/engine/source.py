"""The lane source: per-lane chunk streams turned into records, with sentinels and lane ends.

Lanes are interleaved round-robin (one chunk of each lane in turn); the interleaving is an
execution detail, since every accumulator keys its state by lane. After every
``flush_every_k_chunks`` chunks of a lane a :class:`FlushSentinel` is injected into that lane
(an epoch boundary); when a lane's chunks run out a :class:`LaneEnd` follows. ``on_chunk(lane,
chunk_id)`` is called as each chunk starts (the replay cache evicts old epochs there).

``replay_first`` (resumed lane -> (fast end, end) chunk ids) feeds those lanes first, one after
the other, each until its first batch is out (``delivered``, a :class:`FirstBatches` the run
fills) or its replayed chunks end, then round-robin as usual. Chunks up to the fast end (the
chunk after the replay cursor's) are fed at once; each further one only after waiting briefly
for the lane's first batch, so a runner's lookahead does not pull a whole epoch of new chunks
of one lane ahead of the other lanes' replays. The order in which lanes are fed never changes a
lane's stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from .records import DocRef, FlushSentinel, LaneEnd, SampleMeta, SampleRecord


class LaneGate(Protocol):
    """Demand control: the source feeds a lane only while ``ready(lane)`` holds."""

    @property
    def closed(self) -> bool: ...

    def ready(self, lane: int) -> bool: ...

    def wait(self, timeout: float) -> None: ...


def chunk_records(chunk: Any) -> list[SampleRecord]:
    """Pointer records (payload-less) for one chunk: cursor ``(chunk_id, offset)``."""
    lane = chunk.lane_id
    cid = chunk.chunk_id
    out = []
    for offset, (ds, shard, row, epoch) in enumerate(chunk.docs.tolist()):
        doc = DocRef(ds, shard, row, epoch)
        out.append(SampleRecord(None, SampleMeta(lane, (cid, offset), ds, doc, (doc,))))
    return out


#: How long the source waits for a resumed lane's first batch before feeding it another chunk.
_EXTEND_WAIT_S = 0.25


class FirstBatches:
    """The lanes that have produced a batch; the source may wait for one to join."""

    def __init__(self, *, wait: bool) -> None:
        self.waits = wait  # False for an inline run: the batch is out before the next pull
        self._lanes: set[int] = set()
        self._cond = threading.Condition()

    def __contains__(self, lane: object) -> bool:
        return lane in self._lanes

    def add(self, lane: int) -> None:
        if lane not in self._lanes:
            with self._cond:
                self._lanes.add(lane)
                self._cond.notify_all()

    def wait(self, lane: int, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``lane``; True when it still has no batch."""
        if self.waits:
            with self._cond:
                self._cond.wait_for(lambda: lane in self._lanes, timeout)
        return lane not in self._lanes


class LaneSource:
    """Yields item lists (one chunk's records, plus controls) for the selected lanes."""

    def __init__(
        self,
        work_source: Any,
        lanes: Sequence[int],
        *,
        flush_every_k_chunks: int,
        start_chunks: Mapping[int, int] | None = None,
        max_chunks_per_lane: int | None = None,
        gate: LaneGate | None = None,
        on_chunk: Callable[[int, int], None] | None = None,
        replay_first: Mapping[int, tuple[int, int]] | None = None,
        delivered: FirstBatches | None = None,
    ) -> None:
        self.work_source = work_source
        self.lanes = list(lanes)
        self.k = flush_every_k_chunks
        self.start_chunks = dict(start_chunks or {})
        self.max_chunks_per_lane = max_chunks_per_lane
        self.gate = gate
        self.on_chunk = on_chunk
        self.replay_first = dict(replay_first or {})
        self.delivered = delivered if delivered is not None else FirstBatches(wait=False)
        self.chunks_emitted: dict[int, int] = {lane: 0 for lane in self.lanes}

    def __iter__(self) -> Iterator[list[Any]]:
        streams = {
            lane: self.work_source.lane_chunks(lane, self.start_chunks.get(lane, 0))
            for lane in self.lanes
        }
        gate = self.gate
        # Resumed lanes first, one after the other, each until its first batch: the first
        # lane's batches come after its own replay, not after every lane's.
        delivered = self.delivered
        for lane in sorted(self.replay_first):
            fast_end, end = self.replay_first[lane]
            while lane in streams and lane not in delivered:
                nxt = self._next_chunk_id(lane)
                if nxt >= end or (gate is not None and not gate.ready(lane)):
                    break  # leave the lane to the round-robin
                if nxt >= fast_end and not delivered.wait(lane, _EXTEND_WAIT_S):
                    continue  # the batch is out: the loop condition moves on
                if gate is not None and gate.closed:
                    return
                yield self._emit(streams, lane)
        while streams:
            fed = False
            for lane in list(streams):
                if gate is not None and not gate.ready(lane):
                    continue  # the lane's consumers are far behind: feed the others
                fed = True
                yield self._emit(streams, lane)
            if gate is not None and gate.closed:
                return  # the host is shutting down
            if not fed and gate is not None:
                gate.wait(0.05)

    def _next_chunk_id(self, lane: int) -> int:
        return self.start_chunks.get(lane, 0) + self.chunks_emitted[lane]

    def _emit(self, streams: dict[int, Iterator[Any]], lane: int) -> list[Any]:
        """The lane's next chunk as records (plus a sentinel at an epoch end), or its end."""
        limit = self.max_chunks_per_lane
        chunk = None
        if limit is None or self.chunks_emitted[lane] < limit:
            chunk = next(streams[lane], None)
        if chunk is None:
            del streams[lane]
            return [LaneEnd(lane)]
        self.chunks_emitted[lane] += 1
        if self.on_chunk is not None:
            self.on_chunk(lane, chunk.chunk_id)
        items: list[Any] = chunk_records(chunk)
        nxt = chunk.chunk_id + 1
        if self.k and nxt % self.k == 0:
            items.append(FlushSentinel(lane, nxt))
        return items
