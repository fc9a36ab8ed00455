"""One bad record never stops the pipeline unless its dataset says so: the tests that break
something on purpose against a real process or file system.

The hermetic tests of the same topic are in ``tests/unit/test_bad_records.py``.
"""

from __future__ import annotations

import pytest

from zephon_testing.scenarios.bad_records import (
    run_bad_records_server,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.service
@pytest.mark.timeout(120)
def test_server_skips_bad_records_stays_serving_and_counts_them(tmp_path, corpus_dir):
    run_bad_records_server(tmp_path, corpus_dir)
