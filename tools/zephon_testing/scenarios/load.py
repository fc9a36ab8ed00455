"""The scenarios of ``tests/reliability/test_load.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_testing.infra import free_port
from zephon_testing.scenarios.faults import health_status, proc_stats, wait_until
from zephon_testing.servers import ServerProcess, write_config

TIER = os.environ.get("ZEPHON_RELIABILITY_TIER", "ci")


LONG = TIER == "long"


HOLD_S = 120.0 if LONG else 14.0


def endless_config(path: Path, corpus_dir: Path, lanes: int) -> Path:
    """Small batches over a repeating corpus: lanes never end."""
    return write_config(
        path,
        corpus_dir,
        lanes=lanes,
        chunk_size=8,
        exhaustion="repeat",
        extra_ops=[{"pack_flat": {"max_length": 128}}, {"shuffle": {"buffer_size": 8}}],
        batch=2,
    )


class LaneReader:
    """One raw StreamBatches call on its own thread: reads, acks (optionally slowly), records
    the wait for every next batch; ``stop()`` cancels the call."""

    def __init__(
        self,
        stub: pb_grpc.DataServiceStub,
        lane: int,
        *,
        start_seq: int = 0,
        consumer: str | None = None,
        step_s: float = 0.0,
        ack: bool = True,
        limit: int | None = None,
    ) -> None:
        self.lane = lane
        self.step_s = step_s
        self.ack = ack
        self.limit = limit
        self.waits: list[float] = []
        self.times: list[float] = []  # when each batch arrived (monotonic)
        self.seqs: list[int] = []
        self.error: grpc.RpcError | None = None
        self.ended = False
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put(
            pb.StreamBatchesRequest(
                open=pb.OpenLane(lane=lane, start_seq=start_seq, consumer=consumer or f"l{lane}")
            )
        )
        self._stopping = threading.Event()
        self.call = stub.StreamBatches(self._gen(), timeout=HOLD_S + 120)
        self.thread = threading.Thread(target=self._run, name=f"reader-{lane}", daemon=True)
        self.thread.start()

    def _gen(self):
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def _run(self) -> None:
        it = iter(self.call)
        try:
            while not self._stopping.is_set():
                asked = time.monotonic()
                resp = next(it, None)
                if resp is None or resp.WhichOneof("kind") == "end":
                    self.ended = True
                    return
                now = time.monotonic()
                self.waits.append(now - asked)
                self.times.append(now)
                self.seqs.append(resp.batch.seq)
                if self.step_s:
                    self._stopping.wait(self.step_s)
                if self.ack:
                    self._requests.put(
                        pb.StreamBatchesRequest(ack=pb.Ack(next_seq=resp.batch.seq + 1))
                    )
                if self.limit is not None and len(self.seqs) >= self.limit:
                    self._stopping.wait()
        except grpc.RpcError as exc:
            if not self._stopping.is_set():
                self.error = exc
        finally:
            self._requests.put(None)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self.call.cancel()
        self.thread.join(timeout)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample of a Prometheus exposition (0 when absent)."""
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    found = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def run_streams_load(
    corpus_dir: Path, workdir: Path, *, streams: int = 64, hold_s: float = HOLD_S
) -> dict[str, Any]:
    """Hold ``streams`` lane streams (one per lane, 8 channels) for ``hold_s`` seconds while
    sampling the server's RSS, threads and FDs every 0.25 s. The first 40 % is warm-up."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = endless_config(workdir / "load.yaml", corpus_dir, lanes=streams)
    srv = ServerProcess(["--config", str(cfg), "--runner", "threads"], workdir)
    channels = [grpc.insecure_channel(srv.address) for _ in range(8)]
    samples: list[tuple[float, dict[str, int]]] = []
    readers: list[LaneReader] = []
    try:
        started = time.monotonic()
        readers = [
            LaneReader(pb_grpc.DataServiceStub(channels[lane % 8]), lane) for lane in range(streams)
        ]
        while (now := time.monotonic()) - started < hold_s:
            samples.append((now - started, proc_stats(srv.proc.pid)))
            time.sleep(0.25)
        healthy = health_status(srv.address)
    finally:
        for reader in readers:
            reader.stop()
        for channel in channels:
            channel.close()
        code = srv.terminate()
    assert code == 0, srv.output()[-3000:]
    warm = [s for t, s in samples if t >= 0.4 * hold_s]
    warm_from = started + 0.4 * hold_s
    waits = [w for r in readers for w, at in zip(r.waits, r.times) if at >= warm_from]
    spread = {k: max(s[k] for s in warm) - min(s[k] for s in warm) for k in ("threads", "fds")}
    half = len(warm) // 2
    rss_first = sorted(s["rss"] for s in warm[:half])[half // 2]
    rss_last = sorted(s["rss"] for s in warm[half:])[(len(warm) - half) // 2]
    return {
        "streams": streams,
        "hold_s": hold_s,
        "errors": [f"lane {r.lane}: {r.error.code().name}" for r in readers if r.error],
        "ended": sum(r.ended for r in readers),
        "batches": sum(len(r.seqs) for r in readers),
        "batches_per_s": sum(len(r.seqs) for r in readers) / hold_s,
        "min_batches_per_stream": min(len(r.seqs) for r in readers),
        "wait_p50_ms": percentile(waits, 50) * 1000,
        "wait_p99_ms": percentile(waits, 99) * 1000,
        "rss_mb": (rss_first / 2**20, rss_last / 2**20),
        "rss_growth_mb": (rss_last - rss_first) / 2**20,
        "threads": (min(s["threads"] for s in warm), max(s["threads"] for s in warm)),
        "fds": (min(s["fds"] for s in warm), max(s["fds"] for s in warm)),
        "threads_spread": spread["threads"],
        "fds_spread": spread["fds"],
        "health": healthy,
    }


@contextlib.contextmanager
def _endless_server(
    corpus_dir: Path, workdir: Path, name: str, lanes: int, *flags: str
) -> Iterator[tuple[ServerProcess, pb_grpc.DataServiceStub]]:
    """A server of :func:`endless_config` (``<name>.yaml`` in ``workdir``, created) with
    ``flags``, and a stub on one channel to it; afterwards the server must exit with 0."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = endless_config(workdir / f"{name}.yaml", corpus_dir, lanes=lanes)
    srv = ServerProcess(["--config", str(cfg), *flags], workdir)
    channel = grpc.insecure_channel(srv.address)
    try:
        yield srv, pb_grpc.DataServiceStub(channel)
    finally:
        channel.close()
        code = srv.terminate()
    assert code == 0, srv.output()[-3000:]


def run_slow_consumer(corpus_dir: Path, workdir: Path, window_s: float = 3.0) -> dict[str, Any]:
    """Four lanes read fast for ``window_s`` (baseline); then three fast and one slow (one
    batch per 0.2 s, acked) for the same time. Figures: per-lane batch rates."""
    with _endless_server(corpus_dir, workdir, "slow", 4) as (_, stub):
        readers = [LaneReader(stub, lane, consumer="a") for lane in range(4)]
        time.sleep(window_s)
        base = [len(r.seqs) / window_s for r in readers]
        for r in readers:
            r.stop()
        starts = [r.seqs[-1] + 1 if r.seqs else 0 for r in readers]
        readers = [
            LaneReader(
                stub, lane, start_seq=starts[lane], consumer="b", step_s=0.2 if lane == 0 else 0
            )
            for lane in range(4)
        ]
        time.sleep(window_s)
        mixed = [len(r.seqs) / window_s for r in readers]
        for r in readers:
            r.stop()
        errors = [r.error for r in readers if r.error]
    return {
        "baseline_rates": base,
        "mixed_rates": mixed,
        "fast_ratio": min(mixed[1:]) / max(1e-9, min(base[1:])),
        "errors": errors,
    }


def _grow_rpc_threads(stub: pb_grpc.DataServiceStub, mport: int) -> None:
    """Grow the server's RPC thread pool once (it never shrinks): three streams at a time."""
    warm = [LaneReader(stub, 1, consumer=f"warm{i}", limit=2) for i in range(3)]
    assert wait_until(lambda: all(len(w.seqs) >= 2 for w in warm), 10)
    for w in warm:
        w.stop()
    assert wait_until(lambda: metric(scrape(mport), "zephon_active_streams") == 0, 5)
    time.sleep(0.3)


def _lane0_usage(mport: int, pid: int, threads: int | None = None) -> dict[str, float]:
    """Open streams and lane 0's consumers (from /metrics), the server's threads (``threads``
    if already counted)."""
    text = scrape(mport)
    return {
        "streams": metric(text, "zephon_active_streams"),
        "consumers": metric(text, "zephon_lane_consumers", 'lane="0"'),
        "threads": proc_stats(pid)["threads"] if threads is None else threads,
    }


def _blocked_reader(stub: pb_grpc.DataServiceStub) -> LaneReader:
    """A reader of lane 0 that caught up with production (held back by a consumer that never
    acks) and now waits inside the hub for a batch that is not coming."""
    reader = LaneReader(stub, 0, consumer="blocked")
    # Production stops soon past the holder (``--max-ahead`` is checked per chunk).
    seen = [-1]

    def stalled() -> bool:
        count, seen[0] = seen[0], len(reader.seqs)
        return count == seen[0] and count > 0

    assert wait_until(stalled, 15, step=0.5), reader.seqs
    return reader


def _released_within_1s(mport: int, pid: int, before: dict[str, float]) -> bool:
    """Whether open streams, lane 0's consumers and threads are back to ``before`` in 1 s."""

    def released() -> bool:
        text = scrape(mport)
        return (
            metric(text, "zephon_active_streams") == before["streams"]
            and metric(text, "zephon_lane_consumers", 'lane="0"') == before["consumers"]
            and proc_stats(pid)["threads"] <= before["threads"]
        )

    return wait_until(released, 1.0, step=0.02)


def run_cancel_scenario(corpus_dir: Path, workdir: Path) -> dict[str, Any]:
    """A lane held back by a consumer that never acks (A); consumer B reads up to the
    production limit and blocks in the hub waiting for the next batch; cancel B: within 1 s
    the server's open streams, the lane's consumers and its thread count are back."""
    mport = free_port()
    flags = ("--metrics-port", str(mport), "--max-ahead", "8")
    figures: dict[str, Any] = {}
    with _endless_server(corpus_dir, workdir, "cancel", 2, *flags) as (srv, stub):
        pid = srv.proc.pid
        _grow_rpc_threads(stub, mport)
        holder = LaneReader(stub, 0, consumer="holder", ack=False)  # never acks: holds lane 0
        assert wait_until(lambda: len(holder.seqs) >= 8, 10)
        baseline = proc_stats(pid)["threads"]
        figures["before"] = _lane0_usage(mport, pid, threads=baseline)
        reader = _blocked_reader(stub)
        figures["blocked_at"] = len(reader.seqs)
        figures["during"] = _lane0_usage(mport, pid)
        cancelled = time.monotonic()
        reader.stop()
        figures["freed"] = _released_within_1s(mport, pid, figures["before"])
        figures["freed_s"] = time.monotonic() - cancelled
        figures["after"] = _lane0_usage(mport, pid)
        holder.stop()
    return figures


def run_stream_limit(corpus_dir: Path, workdir: Path, limit: int = 3) -> dict[str, Any]:
    """``--max-streams limit``: one stream more gets RESOURCE_EXHAUSTED while health and
    GetInfo answer; after one stream closes a new one opens."""
    figures: dict[str, Any] = {}
    flags = ("--max-streams", str(limit))
    with _endless_server(corpus_dir, workdir, "limit", 4, *flags) as (srv, stub):
        readers = [LaneReader(stub, lane, consumer=f"r{lane}") for lane in range(limit)]
        assert wait_until(lambda: all(r.seqs for r in readers), 10)
        extra = LaneReader(stub, limit, consumer="extra")
        extra.thread.join(10)
        figures["extra"] = (extra.error.code().name, extra.error.details()) if extra.error else None
        figures["health"] = health_status(srv.address)
        figures["info_lanes"] = stub.GetInfo(pb.GetInfoRequest(), timeout=5).num_lanes
        readers[0].stop()
        again: LaneReader | None = None

        def reopened() -> bool:
            nonlocal again
            if again is not None and again.error is None and again.seqs:
                return True
            if again is None or again.error is not None:
                again = LaneReader(stub, limit, consumer="again")
            time.sleep(0.1)
            return again.error is None and bool(again.seqs)

        figures["reopened"] = wait_until(reopened, 5)
        for r in [*readers, extra, again]:
            if r is not None:
                r.stop()
    return figures
