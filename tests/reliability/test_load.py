"""Load: 64 concurrent lane streams held for a bounded time with flat resources; a slow
consumer does not slow the others; a cancelled stream frees its thread and buffers within
1 s; the stream limit answers RESOURCE_EXHAUSTED while health checks still answer.

``ZEPHON_RELIABILITY_TIER=long`` holds the 64 streams for two minutes instead of a few
seconds. The scenario functions return their figures for ``tools/reliability_report.py``.
"""

from __future__ import annotations

import time

import grpc
import pytest

from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_testing.scenarios.faults import wait_until
from zephon_testing.scenarios.load import (
    HOLD_S,
    LaneReader,
    endless_config,
    run_cancel_scenario,
    run_slow_consumer,
    run_stream_limit,
    run_streams_load,
)
from zephon_testing.servers import ServerProcess

pytestmark = pytest.mark.service


# --------------------------------------------------------------------------------------------
# 64 concurrent lane streams
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(HOLD_S + 120)
def test_64_lane_streams_held_without_errors_and_flat_resources(corpus_dir, tmp_path):
    figures = run_streams_load(corpus_dir, tmp_path)
    print(figures)
    assert figures["errors"] == [] and figures["ended"] == 0, figures
    assert figures["min_batches_per_stream"] >= 10, figures  # every stream kept moving
    assert figures["health"] == "SERVING"
    # Flat after warm-up: a fixed set of threads and descriptors, no memory growth.
    assert figures["threads_spread"] <= 2, figures
    assert figures["fds_spread"] <= 2, figures
    assert figures["rss_growth_mb"] < 16, figures


# --------------------------------------------------------------------------------------------
# A slow consumer does not slow the others
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_one_slow_consumer_does_not_slow_the_others(corpus_dir, tmp_path):
    figures = run_slow_consumer(corpus_dir, tmp_path)
    assert not figures["errors"], figures
    assert figures["mixed_rates"][0] <= 6, figures  # the slow one really was slow
    # The fast lanes keep at least 70 % of their rate (they usually gain: less total work).
    assert figures["fast_ratio"] >= 0.7, figures


# --------------------------------------------------------------------------------------------
# A cancelled stream frees its thread and buffers within 1 s
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_cancelled_stream_frees_its_thread_and_buffers_within_1s(corpus_dir, tmp_path):
    figures = run_cancel_scenario(corpus_dir, tmp_path)
    assert figures["during"]["streams"] == figures["before"]["streams"] + 1, figures
    assert figures["during"]["consumers"] == figures["before"]["consumers"] + 1, figures
    assert figures["freed"] and figures["freed_s"] < 1.0, figures


# --------------------------------------------------------------------------------------------
# Stream limit
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_stream_limit_answers_resource_exhausted_while_health_answers(corpus_dir, tmp_path):
    figures = run_stream_limit(corpus_dir, tmp_path)
    assert figures["extra"] is not None, figures
    code, details = figures["extra"]
    assert code == "RESOURCE_EXHAUSTED" and "stream limit reached (3 open streams)" in details
    assert figures["health"] == "SERVING" and figures["info_lanes"] == 4
    assert figures["reopened"], figures


# --------------------------------------------------------------------------------------------
# A reconnect whose acknowledgements were lost with the connection
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_reconnect_past_the_slowest_consumer_after_lost_acks(corpus_dir, tmp_path):
    """Peer A holds lane 0 at seq 1; peer B reads on without its acks reaching the server
    (they were in flight when its connection died) and reopens where it is: every seq already
    produced is reachable, even beyond A + --max-ahead. The log holds at most --max-ahead + 8
    batches past A, so B's next batch comes once A moves (here: leaves)."""
    cfg = endless_config(tmp_path / "lost-acks.yaml", corpus_dir, lanes=2)
    srv = ServerProcess(["--config", str(cfg), "--max-ahead", "2"], tmp_path)
    channel = grpc.insecure_channel(srv.address)
    stub = pb_grpc.DataServiceStub(channel)
    try:
        a = LaneReader(stub, 0, consumer="peer-a", limit=1)
        assert wait_until(lambda: len(a.seqs) == 1, 10)
        b = LaneReader(stub, 0, consumer="peer-b", ack=False)
        seen = [-1]

        def stalled() -> bool:
            count, seen[0] = seen[0], len(b.seqs)
            return count == seen[0] > 0

        assert wait_until(stalled, 15, step=0.5)
        b.stop()
        position = len(b.seqs)
        assert position > 1 + 2, "production overshoot too small for this test"
        again = LaneReader(stub, 0, start_seq=position, consumer="peer-b")
        time.sleep(1.0)
        assert again.error is None, again.error.details()  # opened beyond A + --max-ahead
        a.stop()
        assert wait_until(lambda: again.seqs or again.error, 10)
        assert again.error is None, again.error.details()
        assert again.seqs[0] == position
        for reader in (a, again):
            reader.stop()
    finally:
        channel.close()
        assert srv.terminate() == 0, srv.output()[-3000:]
