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


CONSUMER_MAX_BYTES = 128
"""The longest consumer name a server takes (UTF-8 bytes; the server's ``OpenLane.consumer``
limit, checked here too so that a bad name fails at construction, not at the first batch)."""


def consumer_name(value: Any) -> str:
    """``consumer`` checked as the server checks it: a string of at most
    :data:`CONSUMER_MAX_BYTES` bytes without control characters."""
    if not isinstance(value, str):
        raise ValueError(f"consumer must be a string, got {value!r}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > CONSUMER_MAX_BYTES:
        raise ValueError(
            f"consumer is {size} bytes of UTF-8; the limit is {CONSUMER_MAX_BYTES}: use a "
            "short name like rank3"
        )
    for i, char in enumerate(value):
        if ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
            raise ValueError(
                f"consumer has a control character (U+{ord(char):04X}) at position {i}: use a "
                "short name like rank3"
            )
    return value
