"""The scenarios of ``tests/service/test_replays.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.config import load_config
from zephon_server.engine.execution import ExecutionConfig
from zephon_testing.infra import free_port
from zephon_testing.scenarios.faults import proc_stats, wait_until
from zephon_testing.scenarios.load import metric, scrape
from zephon_testing.servers import (
    ServerProcess,
    dump_digests,
    open_request,
    read_lane,
    response_batches,
    write_config,
)

READ_FIRST = 300  # batches of lane 0 read (and acknowledged) before the replays


KEEP = 64  # consumed batches the server keeps (LaneHub.keep_consumed)


LANE_BATCHES = 400  # of lane 0 in the reference dump


def make_setup(work: Path, corpus_dir: Path):
    """The module's setup in ``work`` (also used by tools/reliability_hardening.py)."""
    cfg = write_config(
        work / "replays.yaml",
        corpus_dir,
        lanes=2,
        k=4,
        exhaustion="repeat",  # endless lanes: a replay's pipeline lives as long as its readers
        extra_ops=[{"pack_flat": {"max_length": 128}}, {"shuffle": {"buffer_size": 8}}],
        batch=2,
    )
    dump = dump_digests(cfg, LANE_BATCHES, lanes="0")[0]
    pipeline, _ = load_config(cfg)
    run = pipeline.run(ExecutionConfig(runner="inline"), lanes=[0])
    for batch in run.batches():
        if batch.seq + 1 == LANE_BATCHES:
            break
    boundaries = [run.checkpoint({0: p}).lanes[0].boundary_chunk for p in range(LANE_BATCHES)]
    run.close()
    epochs = {p: (b, boundaries.index(b)) for p, b in enumerate(boundaries)}
    return cfg, work, dump, epochs


def mid_epoch_seqs(epochs, below: int, count: int) -> list[int]:
    """``count`` seqs of one epoch below ``below``, none of them the epoch's first cut."""
    by_boundary: dict[int, list[int]] = {}
    for p, (boundary, first) in epochs.items():
        if 0 < p < below and p > first:
            by_boundary.setdefault(boundary, []).append(p)
    for seqs in by_boundary.values():
        if len(seqs) >= count + 4:
            return seqs[2 : 2 + count]
    raise AssertionError("no epoch long enough")


class Stream:
    """A raw StreamBatches call on its own thread: reads one batch, waits for ``go``, then
    reads (acknowledging) until it has ``count`` batches."""

    def __init__(self, stub, lane: int, seq: int, count: int, go: threading.Event, name: str):
        self.seq, self.count, self.go = seq, count, go
        self.chains: list[str] = []
        self.error: grpc.RpcError | None = None
        self.started = threading.Event()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put(open_request(lane, seq, name))
        self.call = stub.StreamBatches(self._gen(), timeout=120)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _gen(self):
        while (item := self._requests.get()) is not None:
            yield item

    def _run(self) -> None:
        try:
            for resp in self.call:
                batches = response_batches(resp)
                self.chains += [b.chain_digest.hex() for b in batches]
                self.started.set()
                self.go.wait()
                self._requests.put(
                    pb.StreamBatchesRequest(ack=pb.Ack(next_seq=batches[-1].seq + 1))
                )
                if len(self.chains) >= self.count:
                    break
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.started.set()
            self._requests.put(None)
            self.call.cancel()


def serve(cfg: Path, work: Path, *extra: str) -> tuple[ServerProcess, int]:
    mport = free_port()
    args = ["--config", str(cfg), "--max-ahead", "8", "--metrics-port", str(mport), *extra]
    return ServerProcess(args, work), mport


def read_ahead(srv: ServerProcess) -> None:
    """Lane 0 read and acknowledged up to READ_FIRST: its older batches are evicted."""
    batches, _ = read_lane(srv.stub(), 0, count=READ_FIRST, consumer="ahead")
    assert len(batches) >= READ_FIRST


def run_thirty_streams(setup) -> dict[str, int]:
    """Thirty streams at one evicted seq of lane 0 and four at other seqs of its epoch, on a
    real server: every stream gets `zephon dump`'s batches from one shared replay. Returns the
    streams, replays started and the server's threads and RSS (MB) before and during."""
    cfg, work, dump, epochs = setup
    srv, mport = serve(cfg, work)
    streams: list[Stream] = []
    try:
        read_ahead(srv)
        target, *others = mid_epoch_seqs(epochs, READ_FIRST - KEEP - 20, 4)
        before = proc_stats(srv.proc.pid)
        go = threading.Event()
        seqs = [target] * 30 + others
        stub = srv.stub()
        streams = [Stream(stub, 0, s, 24, go, f"r{i}") for i, s in enumerate(seqs)]
        assert all(s.started.wait(60) for s in streams)
        during = proc_stats(srv.proc.pid)
        text = scrape(mport)
        go.set()
        for s in streams:
            s.thread.join(60)
        assert [s.error for s in streams if s.error] == []
        for s in streams:
            assert s.chains[:24] == dump[s.seq : s.seq + 24], s.seq
        assert metric(text, "zephon_replays_started_total") == 1
        assert metric(text, "zephon_replay_readers") == len(seqs)
        # Each stream has its handler and ack-reader threads; one replay adds a pipeline's.
        grown = during["threads"] - before["threads"]
        print(
            f"threads {before['threads']} -> {during['threads']}, "
            f"RSS {before['rss'] >> 20} -> {during['rss'] >> 20} MB"
        )
        assert grown <= 2 * len(seqs) + 20, (before, during)
        assert during["rss"] - before["rss"] < 150 << 20, (before, during)
        assert wait_until(lambda: metric(scrape(mport), "zephon_replays_running") == 0, 10)
    finally:
        for s in streams:
            s.call.cancel()
        assert srv.terminate() == 0, srv.output()[-3000:]
    return {
        "streams": len(seqs),
        "replays": int(metric(text, "zephon_replays_started_total")),
        "threads_before": before["threads"],
        "threads_during": during["threads"],
        "rss_before_mb": before["rss"] >> 20,
        "rss_during_mb": during["rss"] >> 20,
    }
