"""Prometheus metrics: counters updated on send, plus a collector that reads the engine.

Names follow Prometheus conventions (``zephon_`` prefix, ``_total``, ``_seconds``,
``_bytes``); labels are bounded (operator names, lanes, datasets). Engine figures (stalls,
reorder-buffer depth, queue depths, operator time, replay, shares) are read at scrape time
from the hub, so the hot path pays nothing for them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .. import __version__
from ..delivery.hub import LaneHub
from ..engine.numbered_batch import NumberedBatch
from ..engine.replay_cache import ReplayCache
from ..engine.storage.metrics import StorageStats, histogram, storage_stats
from ..runtime.allocator import current_name
from .index_metrics import IndexDiskCollector
from .metric_carry import Carry


class ServiceMetrics:
    """The service's own metrics, registered in ``registry`` (injectable for tests)."""

    def __init__(self, registry: CollectorRegistry, hub: LaneHub | None = None) -> None:
        self.registry = registry
        self.batches_sent = Counter(
            "zephon_batches_sent_total", "Batches sent to consumers", registry=registry
        )
        self.messages_sent = Counter(
            "zephon_messages_sent_total",
            "StreamBatches messages carrying batches (one SampleBatch or one BatchGroup)",
            registry=registry,
        )
        self.tokens_sent = Counter(
            "zephon_tokens_sent_total", "Non-padding tokens sent to consumers", registry=registry
        )
        self.padding_sent = Counter(
            "zephon_padding_tokens_sent_total",
            "Padding tokens sent to consumers",
            registry=registry,
        )
        self.bytes_sent = Counter(
            "zephon_sent_bytes_total", "Serialized batch bytes sent", registry=registry
        )
        self.ring_bytes = Counter(
            "zephon_ring_bytes_total",
            "Tensor bytes sent through shared-memory rings to clients on the same host "
            "(not counted in zephon_sent_bytes_total)",
            registry=registry,
        )
        self.active_streams = Gauge(
            "zephon_active_streams", "Open StreamBatches calls", registry=registry
        )
        self.checkpoint_seconds = Histogram(
            "zephon_checkpoint_duration_seconds",
            "Checkpoint RPC duration",
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
        )
        self.checkpoint_bytes = Gauge(
            "zephon_checkpoint_size_bytes", "Size of the last checkpoint", registry=registry
        )
        self.info = Gauge(
            "zephon_server_info",
            "Always 1; labels: the server's version and the memory allocator it runs on",
            ["version", "allocator"],
            registry=registry,
        )
        self.info.labels(version=__version__, allocator=current_name()).set(1)
        self._lock = threading.Lock()
        if hub is not None:
            registry.register(EngineCollector(hub))
            plan = hub.plan
            registry.register(IndexDiskCollector(plan.index, plan.execution.spill_max_bytes))
        registry.register(ReplayCacheCollector(hub.replay_cache if hub is not None else None))
        registry.register(StorageCollector())

    def sent(
        self, message: bytes, batches: Sequence[NumberedBatch], *, in_ring: bool = False
    ) -> bytes:
        """Count the batches about to be sent as ``message`` (their encoded response, with
        the tensor bytes in the stream's shared-memory ring when ``in_ring``); returns it."""
        self.batches_sent.inc(len(batches))
        self.messages_sent.inc()
        tokens = padding = 0
        for batch in batches:
            n = batch.num_tokens()
            tokens += n
            ids = batch.tensors.get("input_ids")
            if ids is not None:
                padding += int(ids.size) - n
        self.tokens_sent.inc(tokens)
        if padding:
            self.padding_sent.inc(padding)
        self.bytes_sent.inc(len(message))
        if in_ring:
            self.ring_bytes.inc(sum(batch.nbytes for batch in batches))
        return message

    def stream_opened(self) -> None:
        self.active_streams.inc()

    def stream_closed(self) -> None:
        self.active_streams.dec()

    def checkpoint_done(self, seconds: float, size: int) -> None:
        self.checkpoint_seconds.observe(seconds)
        self.checkpoint_bytes.set(size)


class EngineCollector(Collector):
    """Reads the hub and its current run at scrape time."""

    def __init__(self, hub: LaneHub) -> None:
        self.hub = hub
        self._carry = Carry()  # counters of this process's work, across Resume RPCs

    def collect(self) -> Iterator[Any]:
        generation, run = self.hub.current_run()
        yield from self._carry.apply(generation, self._families(run))

    def _families(self, run: Any) -> Iterator[Any]:
        stats = self.hub.stats()
        yield from _lane_metrics(stats)
        yield from _flow_metrics(stats)
        if run is None:
            return
        yield from _step_metrics(run)
        yield from _record_metrics(run, stats["run"])
        yield from _mixture_metrics(run)
        yield from _dataset_token_metrics(run)


def _lane_metrics(stats: dict[str, Any]) -> Iterator[Any]:
    """Per lane: consumer lag, batches buffered and produced, open streams."""
    lag = GaugeMetricFamily(
        "zephon_consumer_lag_batches",
        "Batches produced but not yet acknowledged, per lane (batches cut at the common end "
        "of a finite stream are never acknowledged and do not count)",
        labels=["lane"],
    )
    buffered = GaugeMetricFamily(
        "zephon_lane_buffered_batches", "Batches held in a lane's output log", labels=["lane"]
    )
    produced = CounterMetricFamily(
        "zephon_lane_batches_produced",
        "Batches produced per lane (absolute seq; with end_of_data: shortest, the cut ones "
        "past the common end too)",
        labels=["lane"],
    )
    consumers = GaugeMetricFamily(
        "zephon_lane_consumers", "Open streams registered on a lane", labels=["lane"]
    )
    for lane, st in stats["lanes"].items():
        lag.add_metric([str(lane)], st["unconsumed"])
        buffered.add_metric([str(lane)], st["buffered"])
        produced.add_metric([str(lane)], st["produced"])
        consumers.add_metric([str(lane)], st["consumers"])
    yield from (lag, buffered, produced, consumers)


def _step_metrics(run: Any) -> Iterator[Any]:
    """Per step: stalled sentinels, reorder buffers, queues between steps, worker time."""
    stalled = GaugeMetricFamily(
        "zephon_stalled_sentinels",
        "Flush sentinels currently held back (stalled lanes)",
        labels=["op"],
    )
    stall_time = CounterMetricFamily(
        "zephon_stall_seconds", "Time lanes spent stalled at a sentinel", labels=["op"]
    )
    stalls = CounterMetricFamily(
        "zephon_sentinels_stalled", "Sentinels that had to be held back", labels=["op"]
    )
    for driver in run.drivers:
        name = driver.step.name
        stalled.add_metric([name], driver.stalled_lanes)
        stall_time.add_metric([name], driver.stalled_seconds)
        stalls.add_metric([name], driver.sentinels_stalled_total)
    yield from (stalled, stall_time, stalls)
    yield from _reorder_metrics(run)
    queues = GaugeMetricFamily(
        "zephon_queue_depth", "Item lists waiting between steps", labels=["queue"]
    )
    for stage, runner in enumerate(run.runners):
        for name, size in runner.queue_depths().items():
            queues.add_metric([f"stage{stage}:{name}"], size)
    yield queues
    op_time = HistogramMetricFamily(
        "zephon_op_seconds", "Worker time per micro-batch, per step", labels=["op"]
    )
    for driver in run.drivers:
        buckets, total = driver.step.timing.snapshot()
        op_time.add_metric([driver.step.name], buckets, total)
    yield op_time


def _reorder_metrics(run: Any) -> Iterator[Any]:
    """Per step: completed micro-batches held back for order, now and at most."""
    depth = GaugeMetricFamily(
        "zephon_reorder_buffer_depth",
        "Completed micro-batches held back for order",
        labels=["op"],
    )
    max_depth = GaugeMetricFamily(
        "zephon_reorder_buffer_max_depth", "Largest reorder-buffer depth seen", labels=["op"]
    )
    for runner in run.runners:
        for name, (current, most) in runner.reorder_stats().items():
            depth.add_metric([name], current)
            max_depth.add_metric([name], most)
    yield from (depth, max_depth)


def _record_metrics(run: Any, run_stats: dict[str, Any]) -> Iterator[Any]:
    """Records replayed after a resume, skipped under ``on_error: skip``, and dropped."""
    replayed = CounterMetricFamily(
        "zephon_replayed_records", "Records dropped by the replay filter after a resume"
    )
    replayed.add_metric([], run_stats.get("replayed", 0))
    yield replayed
    skipped = CounterMetricFamily(
        "zephon_records_skipped",
        "Records skipped under on_error: skip (malformed, read_error, tokenize_error, "
        "too_large, chat_error, mask_empty, mask_full, mask_truncated)",
        labels=["dataset"],
    )
    for dataset, n in run_stats.get("skipped", {}).items():
        skipped.add_metric([dataset], n)
    yield skipped
    dropped = CounterMetricFamily(
        "zephon_records_dropped",
        "Records closed without tokens, by dataset and reason (malformed, read_error, "
        "tokenize_error, too_large, chat_error, mask_empty, mask_full, mask_truncated, "
        "empty, filtered, oversized, dropped_last...)",
        labels=["dataset", "reason"],
    )
    for (dataset, reason), n in sorted(dict(run.tombstones).items()):
        dropped.add_metric([dataset, reason], n)
    yield dropped


def _mixture_metrics(run: Any) -> Iterator[Any]:
    """Per dataset: the share of produced tokens and the configured share."""
    share = GaugeMetricFamily(
        "zephon_dataset_token_share", "Share of produced tokens per dataset", labels=["dataset"]
    )
    target = GaugeMetricFamily(
        "zephon_dataset_target_share",
        "Configured mixture share per dataset",
        labels=["dataset"],
    )
    datasets = run.plan.datasets
    total_w = sum(d.spec.weight for d in datasets)
    shares = run.dataset_token_shares()
    for d in datasets:
        target.add_metric([d.spec.name], d.spec.weight / total_w)
        share.add_metric([d.spec.name], shares.get(d.spec.name, 0.0))
    yield from (share, target)


#: Tombstone reasons starting with this are loss-mask errors (a record with nothing to learn,
#: or a chat masking nothing): ``zephon_records_mask_errors_total`` counts them per dataset.
MASK_ERROR_PREFIX = "mask_"


def _dataset_token_metrics(run: Any) -> Iterator[Any]:
    """Per dataset: tokens and trained tokens delivered, records skipped for mask errors."""
    tokens = CounterMetricFamily(
        "zephon_dataset_tokens",
        "Tokens delivered per dataset (padding excluded)",
        labels=["dataset"],
    )
    trained = CounterMetricFamily(
        "zephon_dataset_loss_tokens",
        "Trained tokens delivered per dataset (loss_mask 1; all tokens without a loss_mask)",
        labels=["dataset"],
    )
    mask_errors = CounterMetricFamily(
        "zephon_records_mask_errors",
        "Records skipped for loss-mask errors (tombstone reasons mask_*), per dataset",
        labels=["dataset"],
    )
    counts = run.dataset_token_counts()
    errors: dict[str, int] = {}
    for (dataset, reason), n in dict(run.tombstones).items():
        if reason.startswith(MASK_ERROR_PREFIX):
            errors[dataset] = errors.get(dataset, 0) + n
    for d in run.plan.datasets:
        name = d.spec.name
        n, loss = counts.get(name, (0, 0))
        tokens.add_metric([name], n)
        trained.add_metric([name], loss)
        mask_errors.add_metric([name], errors.get(name, 0))
    yield tokens
    yield trained
    yield mask_errors


class ReplayCacheCollector(Collector):
    """The replay cache's byte ledger at scrape time (shared by every process writing the
    cache, so worker processes' writes and skips are included); empty without a cache."""

    def __init__(self, cache: ReplayCache | None) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Any]:
        used = GaugeMetricFamily(
            "zephon_replay_cache_bytes", "Disk the replay cache takes (whole blocks)"
        )
        budget = GaugeMetricFamily(
            "zephon_replay_cache_budget_bytes", "The replay cache's --replay-cache-max-bytes"
        )
        evicted = CounterMetricFamily(
            "zephon_replay_cache_evicted_bytes",
            "Replay-cache bytes evicted to stay within the budget or the kept epochs",
        )
        skipped = CounterMetricFamily(
            "zephon_replay_cache_writes_skipped",
            "Replay-cache entries not written: budget (does not fit even after eviction), "
            "low_disk (would leave less than the reserve free), disk_full (ENOSPC, and the "
            "pause after it)",
            labels=["reason"],
        )
        cache = self.cache
        counts = cache.usage() if cache is not None else None
        if cache is not None and counts is not None:
            used.add_metric([], counts.bytes)
            budget.add_metric([], cache.budget.max_bytes)
            evicted.add_metric([], counts.evicted_bytes)
            skipped.add_metric(["budget"], counts.skipped_budget)
            skipped.add_metric(["low_disk"], counts.skipped_low_disk)
            skipped.add_metric(["disk_full"], counts.skipped_disk_full)
        yield used
        yield budget
        yield evicted
        yield skipped


class StorageCollector(Collector):
    """Object-store requests of this process and of its worker processes (their counts come
    back with each task's result), read at scrape time (:mod:`..engine.storage.metrics`)."""

    def __init__(self, stats: StorageStats | None = None) -> None:
        self.stats = stats if stats is not None else storage_stats()

    def collect(self) -> Iterator[Any]:
        counts = self.stats.snapshot()
        requests = CounterMetricFamily(
            "zephon_storage_requests",
            "Object-store request attempts by operation (head, list, get, put, delete) and "
            "outcome (ok, not_found, throttled, server_error, network, denied, error)",
            labels=["operation", "outcome"],
        )
        for (operation, outcome), n in sorted(counts.requests.items()):
            requests.add_metric([operation, outcome], n)
        yield requests
        read = CounterMetricFamily(
            "zephon_storage_read_bytes", "Bytes read from object stores (successful GETs)"
        )
        read.add_metric([], counts.read_bytes)
        yield read
        retries = CounterMetricFamily(
            "zephon_storage_retries",
            "Object-store requests retried after a throttled, failed or reset attempt",
            labels=["operation"],
        )
        for operation, n in sorted(counts.retries.items()):
            retries.add_metric([operation], n)
        yield retries
        latency = HistogramMetricFamily(
            "zephon_storage_request_seconds",
            "Object-store request latency per attempt, by operation",
            labels=["operation"],
        )
        for operation in sorted(counts.latency_buckets):
            latency.add_metric(
                [operation], histogram(counts, operation), counts.latency_sum.get(operation, 0.0)
            )
        yield latency


def _flow_metrics(stats: dict[str, Any]) -> Iterator[Any]:
    """The hub's backpressure and shared replays (read from ``LaneHub.stats()``)."""
    held = CounterMetricFamily(
        "zephon_lane_held_back_seconds",
        "Time the pipeline waited because this lane's log was full (--max-ahead + headroom "
        "batches not acknowledged); the other lanes of the run waited too",
        labels=["lane"],
    )
    not_kept = CounterMetricFamily(
        "zephon_lane_batches_not_kept",
        "Batches not kept because the lane's log was full while another lane needed the "
        "pipeline; their readers get them from a replay",
        labels=["lane"],
    )
    cut = CounterMetricFamily(
        "zephon_lane_batches_cut",
        "Batches of the lane at or past the common end of a finite stream (end_of_data: "
        "shortest), produced and dropped so that every lane ends at the same seq",
        labels=["lane"],
    )
    for lane, st in stats["lanes"].items():
        held.add_metric([str(lane)], st.get("held_back_s", 0.0))
        not_kept.add_metric([str(lane)], st.get("not_kept", 0))
        cut.add_metric([str(lane)], st.get("cut", 0))
    yield held
    yield not_kept
    yield cut
    yield _common_end(stats)
    yield from _replay_metrics(stats.get("replays", {}))


def _common_end(stats: dict[str, Any]) -> GaugeMetricFamily:
    """The seq every lane ends at under ``end_of_data: shortest`` (-1 while unknown)."""
    end = (stats.get("end_of_data") or {}).get("end")
    common = GaugeMetricFamily(
        "zephon_lanes_common_end",
        "The seq every lane ends at (end_of_data: shortest), once every lane is far enough to "
        "know it; -1 before, and with end_of_data: longest or an endless stream",
    )
    common.add_metric([], -1 if end is None else end)
    return common


def _replay_metrics(replays: dict[str, int]) -> Iterator[Any]:
    """Replays running, their readers, replays started and streams refused one."""
    running = GaugeMetricFamily(
        "zephon_replays_running", "Replays regenerating older batches of a lane right now"
    )
    running.add_metric([], replays.get("running", 0))
    readers = GaugeMetricFamily(
        "zephon_replay_readers", "Streams reading a replay (several share one regeneration)"
    )
    readers.add_metric([], replays.get("readers", 0))
    started = CounterMetricFamily(
        "zephon_replays_started", "Replays started (each one regeneration, shared by its readers)"
    )
    started.add_metric([], replays.get("started", 0))
    refused = CounterMetricFamily(
        "zephon_replays_refused",
        "Streams refused with RESOURCE_EXHAUSTED because --max-replays replays were running",
    )
    refused.add_metric([], replays.get("refused", 0))
    yield running
    yield readers
    yield started
    yield refused
