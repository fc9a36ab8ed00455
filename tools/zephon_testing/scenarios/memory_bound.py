"""The scenarios of ``tests/reliability/test_memory_bound.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import grpc
import yaml

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.infra import free_port
from zephon_testing.scenarios.faults import proc_stats, wait_until
from zephon_testing.scenarios.load import metric, scrape
from zephon_testing.servers import ServerProcess, open_request, write_config

MAX_AHEAD = 8


BOUND = MAX_AHEAD + 8  # --max-ahead + headroom(8)


def make_huge_config(root: Path, doc_mb: int) -> Path:
    """A pipeline of two lanes over one dataset holding one ``doc_mb`` MB document."""
    sentence = "the quick brown fox jumps over the lazy dog while the river runs on. "
    text = sentence * (doc_mb * 2**20 // len(sentence))
    (root / "big").mkdir()
    (root / "big" / "part-0.jsonl").write_text(json.dumps({"text": text}) + "\n")
    cfg = {
        "seed": 1,
        "lanes": 2,
        "chunk_size": 1,
        "flush_every_k_chunks": 1,
        # The other lane has no document and ends at 0: with end_of_data shortest every batch
        # of the huge one would be cut (never kept); the bound is about a lane that is read.
        "end_of_data": "longest",
        "datasets": [{"name": "big", "path": str(root / "big"), "weight": 1.0}],
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": "byte"}},
            {"pack_flat": {"max_length": 256}},
            {"shuffle": {"buffer_size": 8}},
            {"batch": {"microbatch_size": 4}},
        ],
        "execution": {"runner": "threads", "workers": 2},
    }
    path = root / "huge.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def drain(call) -> None:
    """Read a call's responses until it ends (cancelled at the end of the test)."""
    with contextlib.suppress(grpc.RpcError):
        for _ in call:
            pass


def lane_figures(port: int, lanes: int) -> dict[int, tuple[float, float]]:
    """Per lane (buffered batches, produced-but-unacknowledged batches) from /metrics."""
    text = scrape(port)
    return {
        lane: (
            metric(text, "zephon_lane_buffered_batches", f'lane="{lane}"'),
            metric(text, "zephon_consumer_lag_batches", f'lane="{lane}"'),
        )
        for lane in range(lanes)
    }


def run_never_acking(huge_config: Path, tmp_path: Path) -> dict[str, float]:
    """Streams that never acknowledge, on a real server over a huge document: the lanes hold
    at the bound while the streams stay open. Returns peak RSS (MB), buffered batches and
    unacknowledged batches (the most seen on any lane)."""
    mport = free_port()
    srv = ServerProcess(
        ["--config", str(huge_config), "--max-ahead", str(MAX_AHEAD), "--metrics-port", str(mport)],
        tmp_path,
    )
    calls = []
    leave = threading.Event()

    def never_acks(lane: int):
        yield open_request(lane, 0, f"noack{lane}")
        leave.wait()  # the stream stays open, without a single Ack

    try:
        stub = srv.stub()
        for lane in range(2):  # the document is in one of them; the other one just ends
            call = stub.StreamBatches(never_acks(lane), timeout=170)
            calls.append(call)
            threading.Thread(target=drain, args=(call,), daemon=True).start()
        samples: list[tuple[int, dict[int, tuple[float, float]]]] = []

        def sample() -> bool:
            samples.append((proc_stats(srv.proc.pid)["rss"], lane_figures(mport, 2)))
            return any(lag >= BOUND for _, lag in samples[-1][1].values())

        assert wait_until(sample, 120, step=0.25), samples[-1]
        held = time.monotonic() + 4
        while time.monotonic() < held:  # the bound holds while the stream stays open
            sample()
            time.sleep(0.25)
        rss_mb = max(rss for rss, _ in samples) / 2**20
        buffered = max(b for _, lanes in samples for b, _ in lanes.values())
        lag = max(lg for _, lanes in samples for _, lg in lanes.values())
        print(f"peak RSS {rss_mb:.0f} MB, buffered <= {buffered:.0f}, unacknowledged <= {lag:.0f}")
        assert buffered <= BOUND and lag == BOUND, samples[-1]
        text = scrape(mport)
        assert sum(metric(text, "zephon_lane_consumers", f'lane="{x}"') for x in (0, 1)) >= 1
    finally:
        leave.set()
        for call in calls:
            call.cancel()
        assert srv.terminate() == 0, srv.output()[-3000:]
    return {"rss_mb": rss_mb, "buffered": buffered, "lag": lag, "bound": BOUND}


def run_no_consumer(corpus_dir: Path, tmp_path: Path) -> dict[str, float]:
    """No stream at all for a few seconds: the most batches any lane buffered, and the bound."""
    cfg = write_config(
        tmp_path / "many.yaml",
        corpus_dir,
        lanes=4,
        chunk_size=64,
        exhaustion="repeat",
        extra_ops=[{"pack_flat": {"max_length": 64}}],
        batch=2,
    )
    mport = free_port()
    srv = ServerProcess(
        ["--config", str(cfg), "--max-ahead", str(MAX_AHEAD), "--metrics-port", str(mport)],
        tmp_path,
    )
    try:
        assert wait_until(lambda: any(b > 0 for b, _ in lane_figures(mport, 4).values()), 60)
        worst = 0.0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            worst = max([worst, *(b for b, _ in lane_figures(mport, 4).values())])
            time.sleep(0.25)
        assert 0 < worst <= BOUND, worst
        info = srv.stub().GetInfo(pb.GetInfoRequest(), timeout=10)
        assert {p.next_seq for p in info.acknowledged} == {0}
    finally:
        assert srv.terminate() == 0, srv.output()[-3000:]
    return {"worst": worst, "bound": BOUND, "lanes": 4}
