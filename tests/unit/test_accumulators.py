"""Accumulator contracts: per-lane grouping, resets that leave a lane fresh, latency bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.builders import cursors, rec
from zephon_server.engine.ops.accumulators import CountingAccumulator, PassthroughAccumulator
from zephon_server.engine.ops.batch import BatchAccumulator


def test_counting_groups_per_lane_in_order():
    acc = CountingAccumulator(2)
    out = acc.push_many([rec(0, 0, 0), rec(1, 0, 0), rec(0, 0, 1), rec(1, 0, 1), rec(0, 0, 2)])
    assert cursors(out) == [[(0, 0), (0, 1)], [(0, 0), (0, 1)]]
    assert [g[0].meta.lane_id for g in out] == [0, 1]
    assert acc.has_pending_data(0) and not acc.has_pending_data(1)
    assert cursors(acc.flush()) == [[(0, 2)]]
    assert not acc.has_pending_data()


def test_passthrough_emits_immediately():
    acc = PassthroughAccumulator()
    assert cursors(acc.push_many([rec(0, 0, 0), rec(1, 0, 0)])) == [[(0, 0), (0, 0)]]
    assert not acc.has_pending_data()


lanes_and_counts = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    before=lanes_and_counts,
    after=lanes_and_counts,
    max_batch=st.integers(1, 5),
    reset_lane=st.integers(0, 2),
    batch_acc=st.booleans(),
)
def test_reset_leaves_lane_fresh_and_other_lanes_untouched(
    before, after, max_batch, reset_lane, batch_acc
):
    def make():
        return (
            BatchAccumulator(max_batch, drop_last=False)
            if batch_acc
            else CountingAccumulator(max_batch)
        )

    def stream(spec, chunk):
        return [rec(lane, chunk, i) for i, (lane, _) in enumerate(spec)]

    acc, witness = make(), make()
    acc.push_many(stream(before, 0))
    witness.push_many(stream(before, 0))
    acc.flush(reset=True, lane_id=reset_lane)
    assert not acc.has_pending_data(reset_lane)
    later = stream(after, 1)
    fresh = make()
    got = acc.push_many(later) + acc.flush()
    want_reset_lane = fresh.push_many([r for r in later if r.lane_id == reset_lane]) + fresh.flush()
    assert cursors([g for g in got if g[0].lane_id == reset_lane]) == cursors(want_reset_lane)
    # Other lanes behave exactly as if no reset happened.
    other = witness.push_many(later) + witness.flush()
    assert cursors([g for g in got if g[0].lane_id != reset_lane]) == cursors(
        [g for g in other if g[0].lane_id != reset_lane]
    )


def test_batch_accumulator_tombstones_ride_along_and_epoch_reset_is_chunk_aware():
    acc = BatchAccumulator(2, drop_last=True)
    assert acc.push_many([rec(0, 0, 0), rec(0, 0, 1, tombstone="filtered")]) == []
    assert acc.try_epoch_reset(1, 0) is False  # pre-boundary records still buffered
    out = acc.push_many([rec(0, 1, 0), rec(0, 1, 1)])
    assert cursors(out) == [[(0, 0), (0, 1), (1, 0)]]
    assert acc.try_epoch_reset(1, 0) is True  # only (1, 1) left: after the boundary
    ended = acc.end_lane(0)
    assert [e.meta.tombstone for e in ended[0]] == ["dropped_last"]
