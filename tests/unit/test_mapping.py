"""Rank → lanes mapping: every lane read by exactly one data-parallel replica."""

from __future__ import annotations

import pytest

from zephon_client.mapping import lanes_for_rank


@pytest.mark.parametrize(
    ("world_size", "expected"),
    [
        (1, [[0, 1, 2, 3, 4, 5, 6, 7]]),
        (2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (8, [[0], [1], [2], [3], [4], [5], [6], [7]]),
    ],
)
def test_contiguous_examples_for_8_lanes(world_size, expected):
    assert [lanes_for_rank(r, world_size, 8) for r in range(world_size)] == expected


@pytest.mark.parametrize(
    ("world_size", "expected"),
    [
        (1, [[0, 1, 2, 3, 4, 5, 6, 7]]),
        (2, [[0, 2, 4, 6], [1, 3, 5, 7]]),
        (4, [[0, 4], [1, 5], [2, 6], [3, 7]]),
        (8, [[0], [1], [2], [3], [4], [5], [6], [7]]),
    ],
)
def test_interleaved_examples_for_8_lanes(world_size, expected):
    got = [lanes_for_rank(r, world_size, 8, interleaved=True) for r in range(world_size)]
    assert got == expected


def test_tensor_parallel_peers_share_lanes():
    # 8 ranks, tensor-parallel degree 2: ranks (0,1), (2,3), ... are peers.
    got = [lanes_for_rank(r, 8, 8, data_parallel_size=4) for r in range(8)]
    assert got == [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [4, 5], [6, 7], [6, 7]]
    got = [lanes_for_rank(r, 8, 8, data_parallel_size=2, interleaved=True) for r in range(8)]
    assert got == [[0, 2, 4, 6]] * 4 + [[1, 3, 5, 7]] * 4


@pytest.mark.parametrize("num_lanes", [1, 6, 8, 12, 24])
@pytest.mark.parametrize("world_size", [1, 2, 4, 6, 8, 12])
@pytest.mark.parametrize("interleaved", [False, True])
def test_every_lane_owned_by_exactly_one_replica(num_lanes, world_size, interleaved):
    for dp_size in (d for d in range(1, world_size + 1) if world_size % d == 0):
        if num_lanes % dp_size:
            continue
        group = world_size // dp_size
        per_dp: dict[int, list[int]] = {}
        for rank in range(world_size):
            lanes = lanes_for_rank(
                rank, world_size, num_lanes, data_parallel_size=dp_size, interleaved=interleaved
            )
            assert lanes == sorted(lanes)
            assert len(lanes) == num_lanes // dp_size
            dp = rank // group
            # Peers within a group get equal lanes.
            assert per_dp.setdefault(dp, lanes) == lanes
        owners = sorted(lane for lanes in per_dp.values() for lane in lanes)
        assert owners == list(range(num_lanes))
        assert len(per_dp) == dp_size


def test_lane_count_must_be_divisible_by_the_data_parallel_size():
    with pytest.raises(ValueError, match=r"data_parallel_size=3 does not divide num_lanes=8") as e:
        lanes_for_rank(0, 3, 8)
    assert "fixed when training starts" in str(e.value)
    assert "divisors of 8: 1, 2, 4, 8" in str(e.value)
    with pytest.raises(ValueError, match="num_lanes=8"):
        lanes_for_rank(0, 16, 8)
    with pytest.raises(ValueError, match=r"data_parallel_size=3 must divide world_size=8"):
        lanes_for_rank(0, 8, 12, data_parallel_size=3)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((4, 4, 8), {}, r"rank must be in \[0, world_size=4\), got 4"),
        ((-1, 4, 8), {}, "rank must be >= 0, got -1"),
        ((0, 0, 8), {}, "world_size must be >= 1, got 0"),
        ((0, 1, 0), {}, "num_lanes must be >= 1, got 0"),
        ((0, 2, 8), {"data_parallel_size": 0}, "data_parallel_size must be >= 1, got 0"),
        ((0.0, 2, 8), {}, "rank must be an integer, got 0.0"),
        ((0, True, 8), {}, "world_size must be an integer, got True"),
    ],
)
def test_invalid_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        lanes_for_rank(*args, **kwargs)
