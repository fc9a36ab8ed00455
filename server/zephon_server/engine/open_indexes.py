"""The index entries a shard cache has open: a bounded LRU in front of the shard index.

Opening an entry maps its file (:meth:`.index_dir.IndexDir.open_mapped`) and checks it; its
arrays are views on the mapping, so an open plain-JSONL line index costs page cache, not heap,
and only while it is open. At most ``max_open`` entries stay open (least recently used ones
are closed: the mapping goes with its last array), so a process's memory does not grow with
the number of shards or rows it has read. An entry the index does not have (or has damaged)
is built once, under a per-key lock, by the cache's ``build`` callback, which also saves it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from .shard_index import IndexEntry, ShardIndex

#: (location, format, identity) of one shard version.
Key = tuple[str, str, str]
_STRIPES = 64


class OpenIndexes:
    """An LRU of at most ``max_open`` open :class:`~.shard_index.IndexEntry` objects.

    :meth:`get` returns the entry of a key, opening it from ``index`` or building it with
    ``build(location, format, identity)``; :meth:`peek` never builds. Thread-safe.
    """

    def __init__(
        self, index: ShardIndex, max_open: int, build: Callable[[str, str, str], IndexEntry]
    ) -> None:
        self.index = index
        self.max_open = max_open
        self._build = build
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._open: OrderedDict[Key, IndexEntry] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def get(self, key: Key) -> IndexEntry:
        """The entry of ``key``: open, opened from the index, or built (once at a time)."""
        found = self._lookup(key)
        if found is not None:
            return found
        with self._stripes[hash(key) % _STRIPES]:
            found = self.peek(key)
            if found is None:
                found = self._build(*key)
                self.put(key, found)
            return found

    def peek(self, key: Key) -> IndexEntry | None:
        """The entry of ``key`` if it is open or in the index (then opened); never built."""
        found = self._lookup(key)
        if found is None:
            location, fmt, identity = key
            found = self.index.load(location, fmt, identity)
            if found is not None:
                self.put(key, found)
        return found

    def put(self, key: Key, entry: IndexEntry) -> None:
        """Keep ``entry`` open (closing the least recently used beyond ``max_open``)."""
        if self.max_open == 0:
            return
        with self._lock:
            self._open[key] = entry
            self._open.move_to_end(key)
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)

    def clear(self) -> None:
        """Close every entry."""
        with self._lock:
            self._open.clear()

    def _lookup(self, key: Key) -> IndexEntry | None:
        with self._lock:
            found = self._open.get(key)
            if found is not None:
                self._open.move_to_end(key)
            return found
