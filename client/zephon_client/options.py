"""The checks of :class:`~zephon_client.client.DataClient`'s numeric arguments.

Each returns the value when it is one the client can use and raises :class:`ValueError`
naming the argument, the value and what it takes otherwise (a typo such as ``prefetch="4"``
or a negative timeout is an error at construction, not a ``TypeError`` deep in a reader
thread or a value silently replaced).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any


def whole_number(name: str, value: Any, least: int, meaning: str) -> int:
    """``value`` checked: an integer (not a bool; numpy's too) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < least:
        raise ValueError(f"{name} must be at least {least} ({meaning}), got {value}")
    return int(value)


def seconds(name: str, value: Any, *, allow_none: bool = False, allow_zero: bool = True) -> Any:
    """``value`` checked: a finite number of seconds, >= 0 (> 0 without ``allow_zero``), or
    None where ``allow_none`` says None means no limit."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(float(value))
    ):
        what = "a number of seconds" + (" or None (no limit)" if allow_none else "")
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value}")
    return float(value)


def checkpoint_positions(positions: Mapping[Any, Any]) -> dict[int, int]:
    """``checkpoint(positions=...)`` checked: lane -> next_seq, both integers >= 0; a lane
    may be a string of digits, as a state_dict's positions are after a JSON round trip."""
    out: dict[int, int] = {}
    for lane, seq in positions.items():
        if isinstance(lane, str) and lane.isdecimal():
            lane = int(lane)
        lane = whole_number("checkpoint positions: a lane", lane, 0, "lane ids start at 0")
        out[lane] = whole_number(f"lane {lane}: the position", seq, 0, "a next seq")
    return out
