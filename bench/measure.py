"""Measurements that run in a fresh child process each (``python -m bench.measure KIND ...``).

A fresh process per measurement keeps them independent: no warm caches, threads, worker pools
or heap left over from an earlier one, and the orchestrator's own memory never shows in an RSS
figure. Each writes one JSON object to ``--out``.

Kinds:

``engine``
    The fixed work (``Workload.chunks_per_lane`` chunks of every lane) through ``PipelineRun``
    in-process with ``--runner`` and ``--workers``; time from constructing the run (plan
    compiled beforehand) to its last batch, tokens = non-padding tokens (``padding_mask``).
``tokenizer``
    The texts of exactly the fixed work's documents through the tokenizer alone, in
    micro-batches of 64, with ``--threads`` Python threads (the ceiling).
``long``
    The whole corpus (one pass) in-process with threads x2, RSS sampled after every batch.
``resume``
    Checkpoint in the middle of an epoch with the resume geometry, then time a resumed run to
    its first batch (all lanes, and one lane), with the replayed record count; with the replay
    cache the first run wrote, and without it.

``--profile FILE`` (engine, tokenizer) writes a cProfile of the measured part.

Every kind runs under the garbage-collector policy ``zephon serve`` applies
(:mod:`zephon_server.runtime`: ``tuned`` unless ``ZEPHON_GC`` says otherwise) and the rest
of its process tuning, so the in-process rows and the service rows run the engine alike.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from zephon_server.engine.checkpoint import ResumeState
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.replay_cache import ReplayCache
from zephon_server.engine.run import PipelineRun
from zephon_server.engine.tokenizer import Tokenizer, load_tokenizer

from .workload import Workload, fixed_work_texts, load_plan
from .workload import runtime as workload_runtime


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, reaped children's CPU seconds)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class RssSampler:
    """Samples this process's RSS every ``interval`` seconds in a thread; ``peak`` is the max.

    (``getrusage``'s ``ru_maxrss`` is no use here: a child inherits its parent's high-water
    mark across fork and exec.)
    """

    def __init__(self, interval: float = 0.02) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def step_seconds(run: PipelineRun) -> dict[str, float]:
    """Worker seconds per step as the engine's own timers saw them (this process only)."""
    out: dict[str, float] = {}
    for driver in run.drivers:
        _, total = driver.step.timing.snapshot()
        out[driver.step.name] = out.get(driver.step.name, 0.0) + round(total, 4)
    return out


def steady_rate(progress: list[tuple[float, int]], lo: float = 0.25, hi: float = 0.75) -> float:
    """Tokens/s over the middle half of the delivered tokens (from 25% to 75%).

    ``progress`` is (time, tokens delivered so far) after every batch, in time order. The
    window leaves out start-up and pipeline fill at the beginning and the lane-end drain at
    the end; the finished work held in buffers (shuffle reservoirs, queues, a server's
    lookahead) is about the same at both ends of the window, so it cancels, provided the
    run is long against those buffers (``bench.run`` checks: ``steady_valid``).
    """
    if len(progress) < 8:
        return 0.0
    total = progress[-1][1]
    t_lo, n_lo = next((t, n) for t, n in progress if n >= lo * total)
    t_hi, n_hi = next((t, n) for t, n in progress if n >= hi * total)
    return (n_hi - n_lo) / (t_hi - t_lo) if t_hi > t_lo else 0.0


def _profiled(path: str | None, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    if not path:
        return fn()
    prof = cProfile.Profile()
    try:
        return prof.runcall(fn)
    finally:
        prof.dump_stats(path)


def engine(work: Workload, runner: str, workers: int) -> dict[str, Any]:
    plan = load_plan(work.config, runner, workers)
    gc.collect()
    cpu0, child0 = cpu_seconds()
    t0 = time.perf_counter()
    run = PipelineRun(plan, max_chunks_per_lane=work.chunks_per_lane)
    tokens = batches = 0
    first = last = t0
    progress: list[tuple[float, int]] = []  # (time, tokens so far) after every batch
    for batch in run.batches():
        now = time.perf_counter()
        if not batches:
            first = now
        last = now
        tokens += batch.num_tokens()
        batches += 1
        progress.append((now, tokens))
    cpu1, child1 = cpu_seconds()  # the run is closed: worker processes are reaped
    seconds = last - t0
    return {
        # Ray actors are not this process's children: their CPU is not in cpu_children.
        "cpu_partial": runner == "ray",
        "runner": runner,
        "workers": workers,
        "tokens": tokens,
        "batches": batches,
        "seconds": seconds,
        "rate": tokens / seconds,
        "steady_rate": steady_rate(progress),
        "ttfb": first - t0,
        "cpu_main": cpu1 - cpu0,
        "cpu_children": child1 - child0,
        "cores": (cpu1 - cpu0 + child1 - child0) / seconds,
        "step_seconds": step_seconds(run),
        "replayed": run.stats()["replayed"],
    }


def tokenize_texts(
    tok: Tokenizer, texts: list[str], threads: int, batch: int = 64
) -> list[tuple[float, int]]:
    """Encode ``texts`` in ``batch``-sized calls on ``threads`` worker threads.

    Returns (time, tokens so far) after every call, in order. One thread is a worker thread too,
    like the engine's tokenizer threads: the same calls made from the main thread take more CPU
    per token on the benchmark machine (``python -m bench.main_thread``).
    """
    groups = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    progress: list[tuple[float, int]] = []
    tokens = 0
    with ThreadPoolExecutor(threads) as pool:
        for result in pool.map(tok.encode_batch, groups):
            tokens += sum(len(ids) for ids in result)
            progress.append((time.perf_counter(), tokens))
    return progress


def tokenizer(work: Workload, threads: int) -> dict[str, Any]:
    texts = fixed_work_texts(work)
    tok = load_tokenizer(work.tokenizer)
    tok.encode_batch(texts[:8])  # load lazily built tables outside the timing
    gc.collect()
    cpu0, _ = cpu_seconds()
    t0 = time.perf_counter()
    progress = tokenize_texts(tok, texts, threads)
    seconds = time.perf_counter() - t0
    cpu1, _ = cpu_seconds()
    tokens = progress[-1][1]
    return {
        "threads": threads,
        "documents": len(texts),
        "tokens": tokens,
        "seconds": seconds,
        "rate": tokens / seconds,
        "steady_rate": steady_rate(progress),
        "cpu_main": cpu1 - cpu0,
        "cores": (cpu1 - cpu0) / seconds,
    }


def long_run(work: Workload, runner: str = "threads", workers: int = 2) -> dict[str, Any]:
    """One pass over the whole corpus; RSS after every batch (warm-up = first 20%)."""
    import psutil

    proc = psutil.Process()
    plan = load_plan(work.config, runner, workers)
    gc.collect()
    rss_start = proc.memory_info().rss
    samples: list[tuple[float, int, int]] = []  # (seconds, batches, rss)
    sampler = RssSampler()
    t0 = time.perf_counter()
    run = PipelineRun(plan)
    tokens = batches = 0
    for batch in run.batches():
        tokens += batch.num_tokens()
        batches += 1
        samples.append((time.perf_counter() - t0, batches, proc.memory_info().rss))
    seconds = samples[-1][0] if samples else time.perf_counter() - t0
    peak = sampler.stop()
    warm_at = max(1, int(0.2 * batches))
    warm = next(s for s in samples if s[1] >= warm_at)
    end = samples[-1]
    after = [s[2] for s in samples if s[1] >= warm_at]
    # A compact RSS trace for the JSON: about 100 points.
    step = max(1, len(samples) // 100)
    trace = [[round(t, 2), n, r] for t, n, r in samples[::step]]
    return {
        "runner": runner,
        "workers": workers,
        "tokens": tokens,
        "batches": batches,
        "seconds": seconds,
        "rate": tokens / seconds,
        "rss_start": rss_start,
        "rss_warm": warm[2],
        "warm_batches": warm_at,
        "rss_end": end[2],
        "rss_max_after_warm": max(after),
        "rss_peak": max(peak, max(s[2] for s in samples)),
        "growth": (end[2] - warm[2]) / warm[2],
        "growth_max": (max(after) - warm[2]) / warm[2],
        "trace": trace,
    }


def _until(batches: Iterator[NumberedBatch], done: Callable[[NumberedBatch], bool]) -> int:
    n = 0
    for batch in batches:
        n += 1
        if done(batch):
            break
    return n


def _timed_resume(
    plan: Any, data: bytes, lanes: int, cache: ReplayCache | None, only: list[int] | None = None
) -> dict[str, Any]:
    """Time a resumed run to its first batch and until every lane delivered one."""
    gc.collect()
    t0 = time.perf_counter()
    run = PipelineRun(plan, resume=ResumeState.decode(data), lanes=only, replay_cache=cache)
    it = run.batches()
    b = next(it)
    first = time.perf_counter() - t0
    replayed_first = run.stats()["replayed"]
    seen = {b.lane_id: b.seq}
    want = len(only) if only is not None else lanes

    def every_lane_seen(batch: NumberedBatch) -> bool:
        seen.setdefault(batch.lane_id, batch.seq)
        return len(seen) == want

    if len(seen) < want:
        _until(it, every_lane_seen)
    every_lane = time.perf_counter() - t0
    stats = run.stats()
    it.close()
    return {
        "first": first,
        "every_lane": every_lane,
        "replayed_first": replayed_first,
        "replayed": stats["replayed"],
        "seen": seen,
        "cache": stats["replay_cache"],
    }


def resume(work: Workload, runner: str = "threads", workers: int = 2) -> dict[str, Any]:
    """Checkpoint mid-epoch with the resume geometry; time resumed runs to their first batch.

    The first run writes a replay cache (as ``zephon serve --state-dir`` does); resumes are
    timed with it and, for comparison, without it (every replayed document tokenized again).
    """
    plan = load_plan(work.resume_config, runner, workers)
    cache_dir = Path(tempfile.mkdtemp(prefix="replay-cache-", dir=work.work_dir))
    cache = ReplayCache(cache_dir)
    k = work.resume_k
    lanes = plan.pipeline.lanes
    target_chunk = k // 2  # the middle of the first epoch (chunks 0..k-1)

    # 1. A fresh run up to the middle of an epoch on every lane.
    t0 = time.perf_counter()
    run = PipelineRun(plan, replay_cache=cache)
    it = run.batches()
    first = next(it)
    fresh_ttfb = time.perf_counter() - t0
    reached: dict[int, int] = {}

    def mid_epoch(batch: NumberedBatch) -> bool:
        chunk = max(meta.cursor[0] for meta in batch.rows)
        reached[batch.lane_id] = max(reached.get(batch.lane_id, -1), chunk)
        return len(reached) == lanes and min(reached.values()) >= target_chunk

    consumed = 1 + (0 if mid_epoch(first) else _until(it, mid_epoch))
    state = run.checkpoint()
    data = state.encode()
    latencies = []
    for _ in range(10):
        c0 = time.perf_counter()
        run.checkpoint().encode()
        latencies.append(time.perf_counter() - c0)
    one_lane = ResumeState(
        state.fingerprint, state.components, {0: state.lanes[0]}, state.num_lanes
    ).encode()
    it.close()  # closes the run
    positions = state.positions()
    replay_cursor_chunks = {
        lane: st.replay_cursor[0] if st.replay_cursor else None for lane, st in state.lanes.items()
    }
    boundaries = {lane: st.boundary_chunk for lane, st in state.lanes.items()}

    # 2. Resume every lane (what a server does on Resume or --resume), with the cache and
    #    without it; 3. one lane only (a lane-sharded server, or the cost per lane).
    cached = _timed_resume(plan, data, lanes, cache)
    uncached = _timed_resume(plan, data, lanes, None)
    one = _timed_resume(plan, data, lanes, cache, only=[0])
    shutil.rmtree(cache_dir, ignore_errors=True)
    exact = all(
        r["seen"][lane] == positions[lane] for r in (cached, uncached, one) for lane in r["seen"]
    )

    return {
        "runner": runner,
        "workers": workers,
        "chunk_size": plan.pipeline.chunk_size,
        "k": k,
        "lanes": lanes,
        "batches_before_checkpoint": consumed,
        "positions": positions,
        "boundary_chunks": boundaries,
        "replay_cursor_chunks": replay_cursor_chunks,
        "fresh_ttfb": fresh_ttfb,
        "checkpoint_bytes": len(data),
        "checkpoint_bytes_per_lane": len(data) / lanes,
        "checkpoint_bytes_one_lane": len(one_lane),
        "checkpoint_bytes_marginal_per_lane": (len(data) - len(one_lane)) / (lanes - 1),
        "checkpoint_latency": statistics.median(latencies),
        "resume_ttfb": cached["first"],
        "resume_every_lane": cached["every_lane"],
        "replayed_at_first_batch": cached["replayed_first"],
        "replayed": cached["replayed"],
        "replay_cache": cached["cache"],
        "resume_ttfb_one_lane": one["first"],
        "replayed_one_lane": one["replayed"],
        "resume_ttfb_uncached": uncached["first"],
        "resume_every_lane_uncached": uncached["every_lane"],
        "exact": exact,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one benchmark measurement (child process)")
    parser.add_argument("kind", choices=("engine", "tokenizer", "long", "resume", "delivery"))
    parser.add_argument("--workload", required=True, help="workload JSON file")
    parser.add_argument("--out", required=True, help="result JSON file")
    parser.add_argument("--runner", default="threads")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", default=None, help="write a cProfile here")
    args = parser.parse_args(argv)
    # SIGTERM (the benchmark stopping us) unwinds, so a run closes its worker processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Workload.from_json(Path(args.workload).read_text())
    # In-process rows run as `zephon serve` runs the engine: its process tuning.
    workload_runtime().apply()
    if args.kind == "engine":
        result = _profiled(args.profile, lambda: engine(work, args.runner, args.workers))
    elif args.kind == "tokenizer":
        result = _profiled(args.profile, lambda: tokenizer(work, args.threads))
    elif args.kind == "long":
        result = long_run(work, args.runner, args.workers)
    elif args.kind == "delivery":
        from .delivery import measure as delivery_cost

        result = delivery_cost(work.config)
    else:
        result = resume(work, args.runner, args.workers)
    result["python"] = sys.version.split()[0]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
