"""The lane source: round-robin feeding, sentinels, lane ends, resumed lanes first."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon_server.engine.records import FlushSentinel, LaneEnd, SampleRecord
from zephon_server.engine.source import LaneSource


@dataclass
class FakeChunk:
    lane_id: int
    chunk_id: int
    docs: np.ndarray


class FakeWorkSource:
    """``chunks`` chunks per lane of two documents each (a unit-test stand-in)."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    def lane_chunks(self, lane: int, start: int = 0):
        for cid in range(start, self.chunks):
            yield FakeChunk(lane, cid, np.array([[0, 0, cid * 2 + i, 0] for i in range(2)]))


def order(source: LaneSource) -> list[tuple]:
    """(lane, chunk) per chunk, ('sentinel', lane, boundary) and ('end', lane), in order."""
    out: list[tuple] = []
    for items in source:
        for item in items:
            if isinstance(item, SampleRecord):
                key = (item.meta.lane_id, item.meta.cursor[0])
                if not out or out[-1] != key:
                    out.append(key)
            elif isinstance(item, FlushSentinel):
                out.append(("sentinel", item.lane_id, item.boundary_chunk_id))
            elif isinstance(item, LaneEnd):
                out.append(("end", item.lane_id))
    return out


def test_lanes_are_fed_round_robin_with_sentinels_and_ends():
    got = order(LaneSource(FakeWorkSource(2), [0, 1], flush_every_k_chunks=2))
    assert got == [
        (0, 0),
        (1, 0),
        (0, 1),
        ("sentinel", 0, 2),
        (1, 1),
        ("sentinel", 1, 2),
        ("end", 0),
        ("end", 1),
    ]


def test_resumed_lanes_are_fed_first_one_after_the_other():
    source = LaneSource(
        FakeWorkSource(6),
        [0, 1, 2],
        flush_every_k_chunks=0,
        start_chunks={1: 2, 2: 1},
        replay_first={2: 4, 1: 3},  # lane 2 through chunk 3, lane 1 through chunk 2
    )
    got = [key for key in order(source) if key[0] != "end"]
    assert got[:4] == [(1, 2), (2, 1), (2, 2), (2, 3)]
    # then round-robin over every lane from where each stands
    assert got[4:8] == [(0, 0), (1, 3), (2, 4), (0, 1)]
    # every lane still gets all of its chunks exactly once
    for lane, start in ((0, 0), (1, 2), (2, 1)):
        assert [c for ln, c in got if ln == lane] == list(range(start, 6))


def test_a_lane_with_a_batch_out_leaves_the_priority_phase():
    delivered: set[int] = set()
    source = LaneSource(
        FakeWorkSource(5),
        [0, 1],
        flush_every_k_chunks=0,
        replay_first={0: 4, 1: 4},
        delivered=delivered,
    )
    seen = []
    for items in source:
        key = (
            (items[0].meta.lane_id, items[0].meta.cursor[0])
            if items and isinstance(items[0], SampleRecord)
            else None
        )
        seen.append(key)
        if key == (0, 1):
            delivered.add(0)  # lane 0 produced its first batch after its second chunk
    assert seen[:6] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
