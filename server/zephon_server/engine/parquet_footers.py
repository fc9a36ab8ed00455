"""Parquet footers a shard cache keeps: an LRU bounded by their estimated memory.

A Parquet shard's footer (its ``FileMetaData``, row-group bounds and Arrow schema) is what a
read of its row groups starts from; reading it again costs one more ranged request. Shards are
read in runs (consecutive samples of a dataset come from one shard), so few footers are in use
at a time, but a process meets many over a long run: kept for ever, they grew without bound
(a footer of a wide table is megabytes once parsed). At most :data:`FOOTER_BUDGET` estimated
bytes are kept, the least recently used dropped first, the newest always kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

#: Estimated bytes of footers kept per cache.
FOOTER_BUDGET = 256 << 20
#: A parsed footer takes about this many times its serialized size in memory (measured on a
#: 2,000-column file: about 5 MB for 300 KB).
MEMORY_PER_SERIALIZED_BYTE = 16


class FooterCache:
    """Footers by path, each valid for one shard identity (thread-safe)."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = FOOTER_BUDGET if budget is None else budget
        self._lock = threading.Lock()
        self._footers: OrderedDict[str, tuple[str, Any, int]] = OrderedDict()
        self._bytes = 0

    def get(self, path: str, identity: str) -> Any | None:
        """The footer kept for ``path`` at ``identity`` (None: none, or another version's)."""
        with self._lock:
            entry = self._footers.get(path)
            if entry is None or entry[0] != identity:
                return None
            self._footers.move_to_end(path)
            return entry[1]

    def put(self, path: str, identity: str, footer: Any, serialized_size: int) -> None:
        """Keep ``footer``, dropping the least recently used beyond the budget."""
        weight = MEMORY_PER_SERIALIZED_BYTE * serialized_size
        with self._lock:
            self._drop(path)
            self._footers[path] = (identity, footer, weight)
            self._bytes += weight
            while self._bytes > self.budget and len(self._footers) > 1:
                self._bytes -= self._footers.popitem(last=False)[1][2]

    def forget(self, path: str) -> None:
        with self._lock:
            self._drop(path)

    def clear(self) -> None:
        with self._lock:
            self._footers.clear()
            self._bytes = 0

    def _drop(self, path: str) -> None:
        entry = self._footers.pop(path, None)
        if entry is not None:
            self._bytes -= entry[2]
