"""A thread-safe LRU of values that each take a known number of bytes, within a byte budget.

The shard cache keeps decompressed shards, zstd frames, object-store blocks and decoded
Parquet row groups in one of these (:class:`~.shards.ShardCache`). Putting a value evicts the
least recently used ones until it fits; a value larger than the whole budget is not kept
(warned about once per key: it is re-read on every access).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

logger = logging.getLogger(__name__)


class ByteLRU:
    """Values by key within ``max_bytes`` (each put with its size); ``hits``, ``evictions``
    and ``bytes_cached`` are plain attributes, read for metrics."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes_cached = 0
        self.hits = 0
        self.evictions = 0
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._too_big_warned: set[Hashable] = set()

    def __len__(self) -> int:
        return len(self._items)

    def look(self, key: Hashable) -> Any:
        """The value of ``key``, or None (its recency unchanged, no hit counted)."""
        with self._lock:
            item = self._items.get(key)
            return None if item is None else item[0]

    def get(self, key: Hashable) -> Any:
        """The value of ``key`` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Keep ``value`` (``nbytes``) under ``key``, evicting the least recently used values
        until it fits; not kept when it alone exceeds the budget."""
        with self._lock:
            self._pop(key)
            if nbytes > self.max_bytes:
                if key not in self._too_big_warned:
                    self._too_big_warned.add(key)
                    logger.warning(
                        "shard cache entry %r needs %d bytes, more than the whole budget of %d "
                        "bytes; it will be re-read on every access (raise max_bytes)",
                        key,
                        nbytes,
                        self.max_bytes,
                    )
                return
            while self._items and self.bytes_cached + nbytes > self.max_bytes:
                _, (_, freed) = self._items.popitem(last=False)
                self.bytes_cached -= freed
                self.evictions += 1
            self._items[key] = (value, nbytes)
            self.bytes_cached += nbytes

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (absent is fine)."""
        with self._lock:
            self._pop(key)

    def clear(self) -> None:
        """Forget every value (the counters are kept)."""
        with self._lock:
            self._items.clear()
            self.bytes_cached = 0

    def _pop(self, key: Hashable) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes_cached -= old[1]
