"""Large compressed shards (issue 20 leftovers): a spill directory on a full disk (a small
real tmpfs) is a clear error and leaves nothing behind.

The hermetic tests of the same topic are in ``tests/unit/test_spill.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_spill import MIB, info, rows, write_formats
from zephon_server.engine.shards import ShardCache
from zephon_server.engine.spill import SpillDir, SpillError

pytestmark = pytest.mark.timeout(120)


def test_a_full_spill_disk_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    from zephon_testing.small_fs import tmpfs

    lines = rows(3000)
    path = write_formats(tmp_path / "data", lines)["jsonl.zst"]
    content = (tmp_path / "data" / "jsonl" / "s.jsonl").stat().st_size
    with tmpfs(tmp_path / "small", "256k") as small:
        spill = SpillDir(str(small / "spill"), max_bytes=100 * MIB)  # the disk fills first
        cache = ShardCache(spill=spill, spill_threshold=64 * 1024)
        shard = info(path, "jsonl.zst", len(lines))
        assert content > 1 * MIB
        assert cache.num_rows(shard.path, "jsonl.zst") == len(lines)
        with pytest.raises(SpillError, match=r"spill directory .* is out of disk space") as err:
            cache.read_rows(shard, [0], "t")
        assert "raise --spill-max-bytes" in str(err.value)
        assert not [p for p in (small / "spill").iterdir() if p.name != ".lock"]
