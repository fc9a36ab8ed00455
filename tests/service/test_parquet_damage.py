"""A damaged Parquet row group on the processes runner (worker processes: the tier that may
start them): the same documents and tombstones as the inline runner, the oracle. The other
runners are in ``tests/unit/test_parquet_reads.py``."""

from __future__ import annotations

import pytest

from tests.unit.test_bad_records import collect
from tests.unit.test_parquet_reads import damaged_shard, pipeline

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]


def test_a_damaged_row_group_on_worker_processes_equals_the_inline_run(tmp_path):
    path = damaged_shard(tmp_path)
    inline_docs, inline_tombstones, _ = collect(pipeline(path, "skip"), "inline")
    docs, tombstones, stats = collect(pipeline(path, "skip"), "processes")
    assert docs == inline_docs and tombstones == inline_tombstones
    assert stats["skipped"] == {"ds": 20}
