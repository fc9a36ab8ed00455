"""Request limits and undecodable requests, on a real server: the hermetic tests.

The tests of the same topic that break something on purpose against a real process or file system
are in ``tests/reliability/test_request_limits.py``.
"""

from __future__ import annotations

import logging

from zephon_server.service.ratelimit import RateLimitedLog


def test_rate_limited_log_counts_the_lines_it_held_back(caplog):
    now = [100.0]
    logger = logging.getLogger("zephon.test.ratelimit")
    reports = RateLimitedLog(logger, interval=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger.name)
    written = []
    for step in range(50):  # 25 s of one line every half second, two kinds
        now[0] = 100.0 + step * 0.5
        written.append(reports.warning("a", "problem %s from %s", "A", "peer"))
        reports.warning("b", "other problem")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:2] == ["problem A from peer", "other problem"]
    assert messages[2] == "problem A from peer (19 more like it in the last 10 s)"
    assert sum(written) == 3 and len(messages) == 6
