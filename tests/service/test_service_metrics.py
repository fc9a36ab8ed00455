"""Metrics: a real Prometheus scrapes a real server; engine metrics via an injected registry."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.delivery.hub import LaneHub
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.base import Operator, OpTraits
from zephon_server.service.metric_carry import STREAM_POSITIONS
from zephon_testing.infra import free_port, prometheus_available, start_prometheus
from zephon_testing.servers import read_lane, server, write_config

pytestmark = pytest.mark.service


def stalling_ops():
    # 5 records per chunk, a sentinel after every chunk, batches of 3: batch stalls often.
    return [{"shuffle": {"buffer_size": 4, "algorithm": "block"}}]


def test_prometheus_scrapes_stalls_reorder_depth_and_exact_batch_count(tmp_path, corpus_dir):
    assert prometheus_available(), "tools/install-system-deps.sh must install prometheus"
    cfg = write_config(
        tmp_path / "p.yaml", corpus_dir, chunk_size=5, k=1, batch=3, extra_ops=stalling_ops()
    )
    metrics_port = free_port()
    index_dir = tmp_path / "index"
    args = ["--config", str(cfg), "--metrics-port", str(metrics_port)]
    args += ["--index-dir", str(index_dir)]
    with server(args, tmp_path) as srv:
        received = wire_bytes = 0
        for lane in range(4):
            batches, end = read_lane(srv.stub(), lane)
            assert end is not None
            received += len(batches)
            wire_bytes += sum(pb.StreamBatchesResponse(batch=b).ByteSize() for b in batches)
        with start_prometheus(tmp_path, [f"127.0.0.1:{metrics_port}"]) as prom:
            sent = prom.wait_for(
                "sum(zephon_batches_sent_total)",
                lambda r: r and float(r[0]["value"][1]) == received,
            )
            assert float(sent[0]["value"][1]) == received
            # the bytes counter counts the (hand-encoded) responses exactly
            sent_bytes = prom.query("sum(zephon_sent_bytes_total)")
            assert float(sent_bytes[0]["value"][1]) == wire_bytes > 0
            # the server runs on mimalloc (--allocator auto) and says so
            info = prom.query("zephon_server_info")
            assert info[0]["metric"]["allocator"] == "mimalloc", info
            stalls = prom.wait_for('zephon_sentinels_stalled_total{op="batch"}', lambda r: r)
            assert float(stalls[0]["value"][1]) > 0
            stalled_now = prom.query("zephon_stalled_sentinels")
            assert {s["metric"]["op"] for s in stalled_now} >= {"batch", "shuffle"}
            depth = prom.query("zephon_reorder_buffer_depth")
            assert {s["metric"]["op"] for s in depth} >= {"fetch+decode_text+tokenize", "batch"}
            assert prom.query("zephon_reorder_buffer_max_depth")
            lag = prom.query("zephon_consumer_lag_batches")
            assert sorted(s["metric"]["lane"] for s in lag) == ["0", "1", "2", "3"]
            assert prom.query("zephon_op_seconds_count")
            shares = prom.query("zephon_dataset_token_share")
            assert {s["metric"]["dataset"] for s in shares} == {"web", "books", "code"}
            # the index the start wrote: its entries and catalogs, as the budget counts them
            on_disk = sum(
                p.stat().st_blocks * 512
                for p in index_dir.rglob("*")
                if p.is_file() and "spill" not in p.relative_to(index_dir).parts
            )
            index_bytes = prom.query("zephon_index_dir_bytes")
            assert float(index_bytes[0]["value"][1]) == on_disk > 0
            assert float(prom.query("zephon_index_dir_budget_bytes")[0]["value"][1]) > on_disk


def test_engine_collector_with_injected_registry(corpus_specs):
    from zephon_server.engine.pipeline import Pipeline
    from zephon_server.service.metrics import ServiceMetrics

    pipe = Pipeline(corpus_specs, lanes=2, chunk_size=5, flush_every_k_chunks=1)
    pipe.decode_text().tokenize().batch(microbatch_size=3)
    hub = LaneHub(pipe, ExecutionConfig(runner="threads", workers=2), max_ahead=1000)
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry, hub)
    hub.start()
    try:
        stream = hub.open(0, "c", 0)
        n = 0
        for item in stream:
            if not hasattr(item, "tensors"):
                break
            metrics.sent(bytes(10), [item])
            hub.ack(0, "c", item.seq + 1)
            n += 1
        assert registry.get_sample_value("zephon_batches_sent_total") == n
        assert registry.get_sample_value("zephon_sent_bytes_total") == 10 * n
        tokens = registry.get_sample_value("zephon_tokens_sent_total")
        padding = registry.get_sample_value("zephon_padding_tokens_sent_total")
        assert tokens > 0 and padding >= 0
        stalled = registry.get_sample_value("zephon_sentinels_stalled_total", {"op": "batch"})
        assert stalled and stalled > 0
        assert registry.get_sample_value("zephon_consumer_lag_batches", {"lane": "0"}) == 0
        assert registry.get_sample_value(
            "zephon_dataset_target_share", {"dataset": "web"}
        ) == pytest.approx(0.5)
    finally:
        hub.stop()


class MaskCheck(Operator):
    """Tombstones records whose loss_mask trains nothing (reason ``mask_empty``), as a chat
    renderer does under ``on_error: skip``."""

    op_name = "mask_check"

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return [e.tombstone("mask_empty") if not e.payload["loss_mask"].any() else e for e in elems]


def test_dataset_tokens_loss_tokens_and_mask_errors_with_injected_registry(corpus_specs):
    from tests.support.loss_masks import sometimes_empty_mask
    from zephon_server.engine.numbered_batch import NumberedBatch
    from zephon_server.engine.pipeline import Pipeline
    from zephon_server.service.metrics import ServiceMetrics

    # Every lane to its end: the counters count produced batches, and the batches cut by
    # end_of_data: shortest would be counted but never read here.
    pipe = Pipeline(
        corpus_specs, lanes=2, chunk_size=8, flush_every_k_chunks=2, end_of_data="longest"
    )
    pipe.decode_text().tokenize().map_transform(fn=sometimes_empty_mask).apply(MaskCheck())
    pipe.batch(microbatch_size=3, drop_last=False)  # one document per row
    hub = LaneHub(pipe, ExecutionConfig(runner="threads", workers=2), max_ahead=100_000)
    registry = CollectorRegistry()
    ServiceMetrics(registry, hub)
    names = [s.name for s in corpus_specs]
    tokens = dict.fromkeys(names, 0)
    trained = dict.fromkeys(names, 0)
    errors = dict.fromkeys(names, 0)
    hub.start()
    try:
        for lane in range(2):
            for item in hub.open(lane, "c", 0):
                if not isinstance(item, NumberedBatch):
                    break
                for i, meta in enumerate(item.rows):
                    name = names[meta.dataset_id]
                    tokens[name] += int(item.tensors["padding_mask"][i].sum())
                    trained[name] += int(item.tensors["loss_mask"][i].sum())
                for meta in item.tombstones:
                    errors[names[meta.dataset_id]] += meta.tombstone == "mask_empty"
                hub.ack(lane, "c", item.seq + 1)
        for log in hub.run.logs.values():
            for meta in log.tail_tombstones:
                errors[names[meta.dataset_id]] += meta.tombstone == "mask_empty"
        assert all(errors.values()) and all(trained[n] < tokens[n] for n in names)
        for name in names:
            labels = {"dataset": name}
            assert registry.get_sample_value("zephon_dataset_tokens_total", labels) == tokens[name]
            got = registry.get_sample_value("zephon_dataset_loss_tokens_total", labels)
            assert got == trained[name]
            got = registry.get_sample_value("zephon_records_mask_errors_total", labels)
            assert got == errors[name]
    finally:
        hub.stop()


def counters(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    """Every ``_total`` sample, by (family, labels)."""
    return {
        (family.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_held_back_time_rises_during_the_hold_and_carries_across_a_resume(corpus_specs):
    # A lane nobody reads fills its log and holds the pipeline back: the counter must rise
    # while that goes on (it used to stay flat until the wait ended), and a Resume (a new run
    # in the hub, whose own count starts at 0) must not make it go backwards.
    from zephon_server.engine.pipeline import Pipeline
    from zephon_server.service.metrics import ServiceMetrics

    # a chunk of 64 documents makes 64 batches of one: far past what a lane may hold
    pipe = Pipeline(corpus_specs, lanes=2, chunk_size=64, flush_every_k_chunks=1)
    pipe.decode_text().tokenize().batch(microbatch_size=1)
    hub = LaneHub(pipe, ExecutionConfig(runner="threads", workers=2), max_ahead=1)
    registry = CollectorRegistry()
    ServiceMetrics(registry, hub)

    def held() -> float:
        return sum(
            registry.get_sample_value("zephon_lane_held_back_seconds_total", {"lane": str(lane)})
            or 0.0
            for lane in (0, 1)
        )

    hub.start()
    try:
        deadline = time.monotonic() + 30
        while hub.stats()["producer_waiting_on"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hub.stats()["producer_waiting_on"] is not None
        first = held()
        time.sleep(1.0)
        during = held()
        assert during >= first + 0.8  # counted while the hold goes on
        before = counters(registry)
        _, _, state = hub.checkpoint({0: 0, 1: 0})
        hub.resume(state)
        assert held() >= during  # the new run's count starts at 0: carried, never backwards
        after = counters(registry)
        backwards = {
            key: (value, after.get(key))
            for key, value in before.items()
            if key[0] not in STREAM_POSITIONS and after.get(key, 0.0) < value
        }
        assert backwards == {}  # no counter of the process's work goes back across a Resume
    finally:
        hub.stop()
