"""Unit tests of the storage layer's pure parts: URL globs (against the local glob), error
classification, backoff, options, identities and in-memory decompression. No sockets: the tests
that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_storage_units.py``.
"""

from __future__ import annotations

import pytest

from zephon_server.engine.storage.metrics import StorageStats
from zephon_server.engine.storage.retry import (
    Requests,
    RetryPolicy,
)

pytestmark = pytest.mark.timeout(30)


def test_requests_in_flight_are_bounded_by_max_concurrency():
    import threading
    import time

    requests = Requests(RetryPolicy(1, 0.0, 0.0), 2, StorageStats())
    lock, now, most = threading.Lock(), [0], [0]

    def attempt():
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.02)
        with lock:
            now[0] -= 1
        return b""

    threads = [
        threading.Thread(target=requests.call, args=("get", "s3://b/k", attempt)) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 2
