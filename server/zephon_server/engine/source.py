"""The lane source: per-lane chunk streams turned into records, with sentinels and lane ends.

Lanes are interleaved round-robin (one chunk of each lane in turn); the interleaving is an
execution detail, since every accumulator keys its state by lane. After every
``flush_every_k_chunks`` chunks of a lane a :class:`FlushSentinel` is injected into that lane
(an epoch boundary); when a lane's chunks run out a :class:`LaneEnd` follows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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
    ) -> None:
        self.work_source = work_source
        self.lanes = list(lanes)
        self.k = flush_every_k_chunks
        self.start_chunks = dict(start_chunks or {})
        self.max_chunks_per_lane = max_chunks_per_lane
        self.gate = gate
        self.chunks_emitted: dict[int, int] = {lane: 0 for lane in self.lanes}

    def __iter__(self) -> Iterator[list[Any]]:
        streams = {
            lane: self.work_source.lane_chunks(lane, self.start_chunks.get(lane, 0))
            for lane in self.lanes
        }
        k = self.k
        limit = self.max_chunks_per_lane
        gate = self.gate
        while streams:
            fed = False
            for lane in list(streams):
                if gate is not None and not gate.ready(lane):
                    continue  # the lane's consumers are far behind: feed the others
                fed = True
                chunk = None
                if limit is None or self.chunks_emitted[lane] < limit:
                    chunk = next(streams[lane], None)
                if chunk is None:
                    del streams[lane]
                    yield [LaneEnd(lane)]
                    continue
                self.chunks_emitted[lane] += 1
                items: list[Any] = chunk_records(chunk)
                nxt = chunk.chunk_id + 1
                if k and nxt % k == 0:
                    items.append(FlushSentinel(lane, nxt))
                yield items
            if gate is not None and gate.closed:
                return  # the host is shutting down
            if not fed and gate is not None:
                gate.wait(0.05)
