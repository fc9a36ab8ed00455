"""The lane source: per-lane chunk streams turned into records, with sentinels and lane ends.

A :class:`LaneGate` (the hub) stops it feeding a lane that is far enough ahead of its
consumers; that bounds the chunks it starts, not what chunks in flight still make, which the
hub bounds by making its producer wait (see :mod:`.hub`).

Lanes are interleaved round-robin (one chunk of each lane in turn); the interleaving is an
execution detail, since every accumulator keys its state by lane. After every
``flush_every_k_chunks`` chunks of a lane a :class:`FlushSentinel` is injected into that lane
(an epoch boundary); when a lane's chunks run out a :class:`LaneEnd` follows. ``on_chunk(lane,
chunk_id)`` is called as each chunk starts (the replay cache evicts old epochs there).

``replay_first`` (resumed lane -> end of its priority chunks) feeds those lanes first, one
after the other, each through its priority chunks or until its first batch is out (it is in
``delivered``, which the run fills), then round-robin as usual. The order in which lanes are
fed never changes a lane's stream.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Mapping, Sequence
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
        replay_first: Mapping[int, int] | None = None,
        delivered: Container[int] = (),
    ) -> None:
        self.work_source = work_source
        self.lanes = list(lanes)
        self.k = flush_every_k_chunks
        self.start_chunks = dict(start_chunks or {})
        self.max_chunks_per_lane = max_chunks_per_lane
        self.gate = gate
        self.on_chunk = on_chunk
        self.replay_first = dict(replay_first or {})
        self.delivered = delivered
        self.chunks_emitted: dict[int, int] = {lane: 0 for lane in self.lanes}

    def __iter__(self) -> Iterator[list[Any]]:
        streams = {
            lane: self.work_source.lane_chunks(lane, self.start_chunks.get(lane, 0))
            for lane in self.lanes
        }
        gate = self.gate
        # Resumed lanes first, one after the other, each until its first batch: the first
        # lane's batches come after its own replay, not after every lane's.
        for lane in sorted(self.replay_first):
            end = self.replay_first[lane]
            while lane in streams and lane not in self.delivered:
                if self._next_chunk_id(lane) >= end or (gate is not None and not gate.ready(lane)):
                    break  # leave the lane to the round-robin
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
