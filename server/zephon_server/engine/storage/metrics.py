"""Storage request counters of this process: requests, bytes read, latency, retries.

Every object-store request attempt is counted once, by operation (``head``, ``list``, ``get``,
``put``, ``delete``) and outcome (``ok``, ``not_found``, ``throttled``, ``server_error``,
``network``, ``denied``, ``error``), with its latency in a histogram per operation; bytes
read are the bodies of successful GETs, and a retry is an attempt made after a failed one.

The counters are plain numbers behind one lock (no Prometheus import in the engine); the
service exports a snapshot at scrape time. Worker processes of the processes runner count in
their own process and hand what they counted since the last task back with each task's
result (:meth:`StorageStats.take_delta`), which the owning process adds in
(:meth:`StorageStats.merge`), so the server's figures cover every process it runs.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

OPERATIONS: tuple[str, ...] = ("head", "list", "get", "put", "delete")
OUTCOMES: tuple[str, ...] = (
    "ok",
    "not_found",
    "throttled",
    "server_error",
    "network",
    "denied",
    "error",
)
#: Upper bounds (seconds) of the request latency histogram's buckets.
LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class StorageCounts:
    """A snapshot (or a delta) of the counters; plain data, picklable."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    read_bytes: int = 0
    retries: Counter[str] = field(default_factory=Counter)
    latency_buckets: dict[str, list[int]] = field(default_factory=dict)
    latency_sum: dict[str, float] = field(default_factory=dict)

    def empty(self) -> bool:
        """Whether nothing was counted."""
        return not self.requests and not self.retries and not self.read_bytes

    def add(self, other: StorageCounts) -> None:
        """Add ``other``'s counts into these."""
        self.requests.update(other.requests)
        self.read_bytes += other.read_bytes
        self.retries.update(other.retries)
        for op, seconds in other.latency_sum.items():
            self.latency_sum[op] = self.latency_sum.get(op, 0.0) + seconds
        for op, counts in other.latency_buckets.items():
            mine = self.latency_buckets.setdefault(op, [0] * (len(LATENCY_BUCKETS) + 1))
            for i, n in enumerate(counts):
                mine[i] += n

    def copy(self) -> StorageCounts:
        """An independent copy."""
        out = StorageCounts()
        out.add(self)
        return out


class StorageStats:
    """The process-wide storage counters (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = StorageCounts()
        self._local = StorageCounts()  # counted here since the last take_delta()

    def request(self, operation: str, outcome: str, seconds: float, nbytes: int = 0) -> None:
        """Count one request attempt."""
        slot = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            for counts in (self._total, self._local):
                counts.requests[(operation, outcome)] += 1
                counts.read_bytes += nbytes
                buckets = counts.latency_buckets.setdefault(
                    operation, [0] * (len(LATENCY_BUCKETS) + 1)
                )
                buckets[slot] += 1
                counts.latency_sum[operation] = counts.latency_sum.get(operation, 0.0) + seconds

    def retry(self, operation: str) -> None:
        """Count one retry of ``operation``."""
        with self._lock:
            self._total.retries[operation] += 1
            self._local.retries[operation] += 1

    def snapshot(self) -> StorageCounts:
        """Everything counted by this process and merged into it."""
        with self._lock:
            return self._total.copy()

    def take_delta(self) -> StorageCounts | None:
        """What this process counted since the last call (None when nothing): a worker
        process sends it back with a task's result."""
        with self._lock:
            if self._local.empty():
                return None
            delta, self._local = self._local, StorageCounts()
            return delta

    def merge(self, delta: StorageCounts | None) -> None:
        """Add a worker process's delta (not counted as this process's own)."""
        if delta is None:
            return
        with self._lock:
            self._total.add(delta)

    def reset(self) -> None:
        """Forget every count (tests)."""
        with self._lock:
            self._total = StorageCounts()
            self._local = StorageCounts()


_STATS = StorageStats()


def storage_stats() -> StorageStats:
    """This process's storage counters."""
    return _STATS


def histogram(counts: StorageCounts, operation: str) -> list[tuple[str, Any]]:
    """Cumulative ``(le, count)`` buckets of one operation, ``+Inf`` last (Prometheus form)."""
    raw = counts.latency_buckets.get(operation, [0] * (len(LATENCY_BUCKETS) + 1))
    out: list[tuple[str, Any]] = []
    running = 0
    for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), raw):
        running += n
        out.append((bound, running))
    return out
