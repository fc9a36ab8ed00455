"""Which lanes a trainer rank reads.

The lane count ``L`` is fixed when training starts; the data-parallel size may change between
runs as long as it divides ``L``, and every lane's stream stays the same. Ranks are grouped so
that ``world_size // data_parallel_size`` consecutive ranks (tensor/pipeline-parallel peers)
share one data-parallel index ``dp = rank // (world_size // data_parallel_size)`` and read the
same lanes. Each data-parallel index owns ``L // data_parallel_size`` lanes:

* contiguous (default): ``[dp * n, (dp + 1) * n)``;
* interleaved: ``dp, dp + data_parallel_size, dp + 2 * data_parallel_size, ...``.
"""

from __future__ import annotations


def lanes_for_rank(
    rank: int,
    world_size: int,
    num_lanes: int,
    *,
    data_parallel_size: int | None = None,
    interleaved: bool = False,
) -> list[int]:
    """The lanes rank ``rank`` of ``world_size`` reads, ascending.

    ``data_parallel_size`` defaults to ``world_size`` (every rank is its own data-parallel
    replica). It must divide both ``world_size`` and ``num_lanes``; a :class:`ValueError`
    names the offending values otherwise.
    """
    _check_int("world_size", world_size, minimum=1)
    _check_int("rank", rank, minimum=0)
    _check_int("num_lanes", num_lanes, minimum=1)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    dp_size = world_size if data_parallel_size is None else data_parallel_size
    _check_int("data_parallel_size", dp_size, minimum=1)
    if world_size % dp_size:
        raise ValueError(
            f"data_parallel_size={dp_size} must divide world_size={world_size} "
            "(world_size // data_parallel_size consecutive ranks share lanes)"
        )
    if num_lanes % dp_size:
        raise ValueError(
            f"data_parallel_size={dp_size} does not divide num_lanes={num_lanes}: the lane "
            "count is fixed when training starts and the data-parallel size must divide it "
            f"(divisors of {num_lanes}: {', '.join(map(str, _divisors(num_lanes)))})"
        )
    dp = rank // (world_size // dp_size)
    if interleaved:
        return list(range(dp, num_lanes, dp_size))
    per_replica = num_lanes // dp_size
    return list(range(dp * per_replica, (dp + 1) * per_replica))


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})
