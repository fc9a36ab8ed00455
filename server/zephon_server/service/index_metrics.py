"""The disk the shard index and the spill files take, for ``/metrics``.

Both grow while a server runs (a rewritten shard gets a new entry; a large compressed shard
is decompressed into a spill file), each under its own budget (``--index-max-bytes``,
``--spill-max-bytes``). An operator sizing the directory, or alerting before a budget starts
removing what a restart would rebuild, needs to see how full they are. Measuring means
listing every file, so a scrape measures at most every :data:`REFRESH_SECONDS` and reports
the last measurement in between. An index directory on an object store reports its budget
only: listing it costs requests, and its entries are shared by every server of the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..engine.index_budget import max_bytes_of
from ..engine.index_dir import IndexDir
from ..engine.spill import SpillDir

#: A scrape re-measures the directories at most this often (seconds).
REFRESH_SECONDS = 60.0


class IndexDiskCollector(Collector):
    """``zephon_index_dir_bytes`` / ``_budget_bytes`` and ``zephon_spill_bytes`` /
    ``_budget_bytes`` of a server's index directory (``index``: None with ``--index-dir
    none``, whose spill files go to the temporary directory under ``spill_max_bytes``)."""

    def __init__(
        self,
        index: IndexDir | None,
        spill_max_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        spill = SpillDir.for_index(index)
        self.spill = spill if index is not None else SpillDir(spill.root, spill_max_bytes)
        self._clock = clock
        self._lock = threading.Lock()
        self._measured: tuple[float, dict[str, int]] | None = None

    def collect(self) -> Iterator[Any]:
        sizes = self._sizes()
        for name, doc in (
            ("zephon_index_dir_bytes", "Disk the shard index's entries and catalogs take"),
            ("zephon_index_dir_budget_bytes", "The shard index's budget (--index-max-bytes)"),
            ("zephon_spill_bytes", "Disk the spill files of large compressed shards take"),
            ("zephon_spill_budget_bytes", "The spill files' budget (--spill-max-bytes)"),
        ):
            if name in sizes:
                family = GaugeMetricFamily(name, f"{doc}; measured at most once a minute")
                family.add_metric([], sizes[name])
                yield family

    def _sizes(self) -> dict[str, int]:
        """The last measurement, re-taken when older than :data:`REFRESH_SECONDS`."""
        now = self._clock()
        with self._lock:
            if self._measured is None or now - self._measured[0] >= REFRESH_SECONDS:
                self._measured = (now, self._measure())
            return self._measured[1]

    def _measure(self) -> dict[str, int]:
        sizes = {
            "zephon_spill_bytes": self.spill.usage(),
            "zephon_spill_budget_bytes": self.spill.budget(),
        }
        index = self.index
        if index is not None:
            sizes["zephon_index_dir_budget_bytes"] = max_bytes_of(index)
            if index.local:
                sizes["zephon_index_dir_bytes"] = sum(blob.size for blob in index.blobs())
        return sizes
