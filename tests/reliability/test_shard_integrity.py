"""Compressed shards either decompress completely or are refused at start-up, naming the file: the
tests that break something on purpose against a real process or file system.

The hermetic tests of the same topic are in ``tests/unit/test_shard_integrity.py``.
"""

from __future__ import annotations

import pytest

from zephon_testing.scenarios.shard_integrity import (
    run_truncated_shard_cli,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.service
@pytest.mark.timeout(120)
def test_explain_dump_and_serve_exit_2_naming_the_truncated_shard(tmp_path):
    run_truncated_shard_cli(tmp_path)
