"""``/metrics`` families of the index directory and the spill files (IndexDiskCollector)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from zephon_server.engine.index_dir import IndexDir
from zephon_server.engine.shard_index import ShardIndex
from zephon_server.service.index_metrics import REFRESH_SECONDS, IndexDiskCollector


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scrape(collector: IndexDiskCollector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def disk_use(*paths: Path) -> int:
    return sum(os.stat(p).st_blocks * 512 for p in paths)


def test_index_and_spill_bytes_are_the_disk_their_files_take(tmp_path: Path) -> None:
    store = IndexDir(str(tmp_path / "index"), max_bytes=10 << 20, spill_max_bytes=5 << 20)
    index = ShardIndex(store)
    starts = np.arange(0, 80_000, 8, dtype=np.int64)
    index.save("/data/a.jsonl", "jsonl", "1-1", len(starts) - 1, {"starts": starts})
    spill = tmp_path / "index" / "spill"
    spill.mkdir()
    (spill / "x.spill").write_bytes(b"y" * 300_000)
    clock = Clock()
    collector = IndexDiskCollector(store, clock=clock)

    got = scrape(collector)
    blobs = [p for p in (tmp_path / "index").rglob("*") if p.is_file() and spill not in p.parents]
    assert got["zephon_index_dir_bytes"] == disk_use(*blobs) >= 80_000
    assert got["zephon_index_dir_budget_bytes"] == 10 << 20
    assert got["zephon_spill_bytes"] == disk_use(spill / "x.spill") >= 300_000
    assert got["zephon_spill_budget_bytes"] == 5 << 20

    # A scrape within the refresh interval reports the last measurement; after it, a new one.
    (spill / "x.spill").unlink()
    assert scrape(collector)["zephon_spill_bytes"] == got["zephon_spill_bytes"]
    clock.now += REFRESH_SECONDS
    assert scrape(collector)["zephon_spill_bytes"] == 0


def test_memory_only_index_reports_the_temporary_spill_directory_alone(tmp_path: Path) -> None:
    got = scrape(IndexDiskCollector(None, spill_max_bytes=123_456))
    assert got["zephon_spill_budget_bytes"] == 123_456
    assert "zephon_spill_bytes" in got
    assert not any(name.startswith("zephon_index_dir") for name in got)
