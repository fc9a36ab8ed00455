"""``make bench``: Zephon's throughput, latency and memory figures, as ratios taken in one run.

``python -m bench.run [--docs 200000] [--token-budget 16e6] [--repeat 3] [--quick]`` generates
(or reuses) a corpus, trains a BPE tokenizer on it, then measures, interleaving configurations
so that machine noise spreads over all of them:

* tokenizer-only tokens/s on the texts of the fixed work with 1 and 2 threads (the ceiling);
* the engine in-process: inline, threads x1/x2, processes x1/x2, Ray x1/x2 (if installed);
* the service over loopback gRPC (threads x2 server) with one and with two client ranks;
* time to first batch, RSS over a long run, checkpoint size per lane and latency (engine and
  Checkpoint RPC), resume-to-first-batch latency and records replayed;
* start-up (:mod:`bench.startup`): launching ``zephon serve`` to SERVING and to the first
  batch, and RSS, by shard count, index state and allocator; the indexer's read rate.

Results: ``bench/results/bench.json`` (everything, every run), ``docs/benchmarks.md`` and
``docs/benchmarks.png`` (via :mod:`bench.report`). The benchmark asserts nothing; it reports
each figure against its target. See :mod:`bench.workload` for the fixed unit of work,
:mod:`bench.measure` and :mod:`bench.service` for how each figure is taken.

Extending: the configurations and ratios are in :mod:`bench.cases` (one line each).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from zephon_server.runtime import allocator

from . import report, startup
from .cases import (
    ALLOCATOR,
    RATIOS,
    ROUND_ORDER,
    THROUGHPUT_CASES,
    Case,
    Ratio,
    measure_child,
    steady_valid,
)
from .common import RESULTS, compile_sources
from .service import checkpoint_rpc
from .tables import duration, verdict
from .workload import TOKENIZER_SAMPLE, VOCAB_SIZE, Workload, prepare

log = logging.getLogger("bench")
KiB = 1024


# -- cases ------------------------------------------------------------------------------------


def round_order(cases: list[Case], reverse: bool) -> list[Case]:
    """One round's order (:data:`~bench.cases.ROUND_ORDER`); every other round is reversed, so
    a steady drift of the machine's speed favours neither side of a ratio."""
    rank = {key: i for i, key in enumerate(ROUND_ORDER)}
    order = sorted(cases, key=lambda c: rank.get(c.key, len(rank)))
    return order[::-1] if reverse else order


# -- figures ----------------------------------------------------------------------------------


def round_ratios(
    num: list[dict[str, Any]] | None, den: list[dict[str, Any]] | None, field: str
) -> list[float | None]:
    """``num / den`` within each round (None where either run lacks the field)."""
    return [
        a[field] / b[field] if a.get(field) and b.get(field) else None
        for a, b in zip(num or (), den or (), strict=False)
    ]


def median_round(ratios: list[float | None]) -> int | None:
    """The round whose ratio is closest to the median of the rounds' ratios."""
    known = [v for v in ratios if v is not None]
    if not known:
        return None
    mid = statistics.median(known)
    return min((abs(v - mid), i) for i, v in enumerate(ratios) if v is not None)[1]


def _ratio_row(
    r: Ratio, runs: dict[str, list[dict[str, Any]]], steady_valid: bool
) -> dict[str, Any]:
    field, label = r.field, r.label
    if field == "steady_rate" and not steady_valid:
        field, label = "rate", label.replace("(steady state)", "(whole run: too short for steady)")
    rounds = round_ratios(runs.get(r.numerator), runs.get(r.denominator), field)
    mid = median_round(rounds)
    row: dict[str, Any] = {
        "key": r.key,
        "label": label,
        "numerator": r.numerator,
        "denominator": r.denominator,
        "target": r.target,
        "target_text": r.target_text,
        "note": r.note,
        "field": field,
        "value": None,
        "shown": "—",
        "rounds": rounds,
        "round": mid,
    }
    if mid is None:
        return row
    value = statistics.median(v for v in rounds if v is not None)
    row["value"] = value
    # A third digit where a target judges the value, so "0.90" never reads as a miss.
    digits = 3 if r.target is not None else 2
    if r.style == "below":
        side = "below" if value <= 1 else "above"
        row["shown"] = f"{value:.{digits}f} ({abs(1 - value) * 100:.1f}% {side})"
    elif r.style == "times":
        row["shown"] = f"{value:.{digits}f}x"
    else:
        row["shown"] = f"{value:.{digits}f}"
    known = [v for v in rounds if v is not None]
    if len(known) > 1:
        row["shown"] += " [rounds: " + ", ".join(f"{v:.2f}" for v in known) + "]"
    if r.target is not None:
        # "x% below" targets are judged in percentage points.
        row["ok"], row["verdict"] = verdict(value, r.target, ">=", points=r.style == "below")
    return row


def _figure(
    key: str,
    label: str,
    value: float,
    shown: str,
    target: float | None = None,
    kind: str = "<=",
    target_text: str = "",
    note: str = "",
    points: bool = False,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "key": key,
        "label": label,
        "value": value,
        "shown": shown,
        "target": target,
        "target_text": target_text,
        "note": note,
    }
    if target is not None:
        row["ok"], row["verdict"] = verdict(value, target, kind, points)
    return row


def figures(
    best: dict[str, dict[str, Any]],
    runs: dict[str, list[dict[str, Any]]],
    long: dict[str, Any] | None,
    resume: dict[str, Any] | None,
    rpc: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """The latency, memory and checkpoint figures."""
    return [
        *_ttfb_figures(runs),
        *_memory_figures(runs, long),
        *_checkpoint_targets(resume, rpc),
        *_checkpoint_latencies(resume, rpc),
        *_resume_figures(resume),
    ]


def _ttfb_figures(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Time to first batch in-process (threads x2, processes x2) and via the service."""
    out = []
    for key, what in (("engine_threads_2", "threads x2"), ("engine_processes_2", "processes x2")):
        if runs.get(key):
            ttfb = min(r["ttfb"] for r in runs[key])
            out.append(
                _figure(
                    f"ttfb_{key}",
                    f"time to first batch, in-process {what}",
                    ttfb,
                    duration(ttfb),
                    note="from constructing the run (plan compiled) to its first batch",
                )
            )
    if runs.get("service_1"):
        r = min(runs["service_1"], key=lambda r: r["ttfb"])
        out.append(
            _figure(
                "ttfb_service",
                "time to first batch via the service (server process start → client)",
                r["ttfb"],
                duration(r["ttfb"]),
                note="server start-up (imports, dataset indexing, plan) "
                f"{duration(r['server_start'])}, then "
                f"{duration(r['ttfb_from_run_start'])} to the first batch",
            )
        )
    return out


def _memory_figures(
    runs: dict[str, list[dict[str, Any]]], long: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """RSS growth and peak over the long run, and the server's peak RSS in the service runs."""
    mb = 1024 * 1024
    out = []
    if long:
        out.append(
            _figure(
                "rss_growth",
                "RSS growth after warm-up (long run, threads x2)",
                long["growth"],
                f"{long['growth'] * 100:+.1f}% ({long['rss_warm'] / mb:.0f} → "
                f"{long['rss_end'] / mb:.0f} MB)",
                0.10,
                "<",
                "< 10%",
                points=True,
            )
        )
        out.append(
            _figure(
                "rss_peak",
                "peak RSS (long run, in-process threads x2, consumer included)",
                long["rss_peak"],
                f"{long['rss_peak'] / mb:.0f} MB",
                note=f"{long['batches']} batches, {long['tokens'] / 1e6:.1f} M tokens in "
                f"{long['seconds']:.0f} s; largest RSS after warm-up "
                f"{long['rss_max_after_warm'] / mb:.0f} MB ({long['growth_max'] * 100:+.1f}%)",
            )
        )
    if runs.get("service_1"):
        peak = max(r["server_rss_peak"] for r in runs["service_1"])
        out.append(
            _figure(
                "server_rss_peak",
                "server peak RSS (service run)",
                peak,
                f"{peak / mb:.0f} MB",
                note="sampled every 100 ms",
            )
        )
    return out


def _checkpoint_targets(
    resume: dict[str, Any] | None, rpc: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The checkpoint and resume figures that have targets: size per lane (engine, RPC) and
    resume to first batch."""
    out = []
    if resume:
        out.append(
            _figure(
                "checkpoint_engine",
                "checkpoint size per lane (PipelineRun.checkpoint().encode())",
                resume["checkpoint_bytes_per_lane"],
                f"{resume['checkpoint_bytes_per_lane']:.0f} B",
                KiB,
                "<=",
                "≤ 1 KiB",
            )
        )
    if rpc:
        out.append(
            _figure(
                "checkpoint_rpc",
                "checkpoint size per lane (Checkpoint RPC)",
                rpc["checkpoint_bytes_per_lane"],
                f"{rpc['checkpoint_bytes_per_lane']:.0f} B",
                KiB,
                "<=",
                "≤ 1 KiB",
            )
        )
    if resume:
        out.append(
            _figure(
                "resume_ttfb",
                f"resume to first batch ({resume['lanes']} lanes, {resume['k']} chunks of "
                f"{resume['chunk_size']} documents per epoch, checkpoint mid-epoch)",
                resume["resume_ttfb"],
                duration(resume["resume_ttfb"]),
                1.0,
                "<=",
                "≤ 1 s",
            )
        )
    return out


def _checkpoint_latencies(
    resume: dict[str, Any] | None, rpc: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Checkpoint latency through the Checkpoint RPC and in-process."""
    out = []
    if rpc:
        out.append(
            _figure(
                "checkpoint_latency_rpc",
                "checkpoint latency, Checkpoint RPC round trip (median of 10)",
                rpc["latency_median"],
                duration(rpc["latency_median"]),
                note=f"persisted atomically in the state directory; slowest "
                f"{duration(rpc['latency_max'])}",
            )
        )
    if resume:
        out.append(
            _figure(
                "checkpoint_latency_engine",
                "checkpoint latency in-process, checkpoint() + encode() (median of 10)",
                resume["checkpoint_latency"],
                duration(resume["checkpoint_latency"]),
            )
        )
    return out


def _resume_figures(resume: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The resume figures without targets: records replayed, every lane, one lane, without
    the replay cache, and a fresh start for comparison."""
    if not resume:
        return []
    return [
        _figure(
            "records_replayed",
            "records replayed on resume (packed rows dropped by the replay filter)",
            resume["replayed"],
            f"{resume['replayed']} ({resume['lanes']} lanes); "
            f"{resume['replayed_one_lane']} (one lane)",
            note=f"bounded by {resume['k']} chunks per lane; "
            f"{'exact' if resume['exact'] else 'NOT exact'}: each lane resumed at its "
            "checkpointed seq",
        ),
        _figure(
            "resume_every_lane",
            "resume until every lane delivered a batch",
            resume["resume_every_lane"],
            duration(resume["resume_every_lane"]),
        ),
        _figure(
            "resume_one_lane",
            "resume to first batch, one lane only",
            resume["resume_ttfb_one_lane"],
            duration(resume["resume_ttfb_one_lane"]),
        ),
        *_uncached_figure(resume),
        _figure(
            "fresh_ttfb_resume_geometry",
            "fresh start to first batch, same geometry (for comparison)",
            resume["fresh_ttfb"],
            duration(resume["fresh_ttfb"]),
        ),
    ]


def _uncached_figure(resume: dict[str, Any]) -> list[dict[str, Any]]:
    """Resume without the replay cache (none in results taken before it was measured)."""
    if "resume_ttfb_uncached" not in resume:
        return []
    cache = resume.get("replay_cache") or {}
    return [
        _figure(
            "resume_uncached",
            "resume without the replay cache: first batch / every lane",
            resume["resume_ttfb_uncached"],
            f"{duration(resume['resume_ttfb_uncached'])} / "
            f"{duration(resume['resume_every_lane_uncached'])}",
            note="every replayed document tokenized again; with the cache "
            f"{cache.get('hits', 0):,} documents were read back and "
            f"{cache.get('misses', 0):,} tokenized",
        )
    ]


# -- machine ----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        memory = psutil.virtual_memory().total / 1e9
    except ImportError:  # pragma: no cover - the bench extra is missing
        memory = 0.0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 1
    return {
        "cores": usable,
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": memory,
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "load_before": list(os.getloadavg()),
    }


def command_line(argv: list[str]) -> str:
    if os.environ.get("MAKELEVEL"):
        extra = os.environ.get("BENCH_ARGS", "").strip()
        return "make bench" + (f" BENCH_ARGS={shlex.quote(extra)}" if extra else "")
    return shlex.join(["python", "-m", "bench.run", *argv])


# -- main -------------------------------------------------------------------------------------


def method(work: Workload, repeat: int) -> list[str]:
    """The Method section's items: how each figure is taken."""
    return _method_runs(work) + _method_ratios(work, repeat)


def _method_runs(work: Workload) -> list[str]:
    """How a throughput row runs: the fixed work, timing, Ray, tokenizer-only, service."""
    return [
        f"Each throughput row runs in a fresh process and delivers the same fixed work, the "
        f"first {work.chunks_per_lane} chunks of every lane (`PipelineRun(max_chunks_per_lane="
        f"{work.chunks_per_lane})`); the run ends when every lane has ended, so shuffle "
        "reservoirs, runner queues and the server's lookahead drain into the measurement. "
        "Tokens are non-padding tokens (`padding_mask`), EOS included.",
        "Time runs from constructing the run (the plan is compiled beforehand) to the last "
        "batch, so start-up (tokenizer load, worker spawn) is included; time to first batch is "
        "reported separately.",
        "Ray rows (when Ray is installed): the fusable stage runs on Ray actors of a private "
        "local Ray that the run starts, so `ray.init` and actor start-up fall in the time to "
        "first batch; the actors are not children of the measuring process, so their CPU "
        "columns are left blank.",
        "Tokenizer-only: the texts of exactly the fixed work's documents, in the engine's order, "
        "encoded in calls of 64 texts by 1 or 2 Python worker threads (`TOKENIZERS_PARALLELISM="
        "false`, as in the engine; worker threads, as in the engine, also for 1 thread: calls "
        "from the main thread took 1.07-1.34x the CPU per token here, see `python -m "
        "bench.main_thread`).",
        "Service: `zephon serve` (threads x2, default flow control) on 127.0.0.1 with the same "
        "YAML and the same per-lane limit (`python -m bench.service serve`, which only passes "
        "`max_chunks_per_lane` to the hub's run); client processes using `zephon_client."
        "DataClient` (digests verified) start before the server and read every batch; time "
        "from the hub's run construction to the last batch at any client. Two ranks = two "
        "client processes with four lanes each. The service rows run without `--state-dir` except "
        "the one marked `--state-dir`, which also writes the replay cache (as `make run` and the "
        "container do). The clients run on the server's host, so by default (`DataClient("
        "shared_memory=True)`, `--shm-ring-mib 64`) they read the tensor bytes through "
        "shared-memory rings and the messages carry the rest; the row marked `--shm-ring-mib 0` "
        "sends the bytes in the gRPC messages, as for clients on other hosts.",
    ]


def _method_ratios(work: Workload, repeat: int) -> list[str]:
    """How the rounds, ratios, long run and resume are taken."""
    return [
        f"Every configuration is measured {repeat} times, in {repeat} rounds that each run "
        "every configuration once, every other round in reverse order. Within a round the two "
        "sides of each target ratio run back to back (`bench.cases.ROUND_ORDER`), so each "
        "ratio is taken per round, between runs seconds apart, and the median over the rounds "
        "is reported (the per-round values are in bench.json, `ratios[].rounds`): the "
        "machine's speed drifts by tens of percent over minutes, which a ratio of two "
        "best-of runs taken minutes apart would mostly measure. The throughput table shows "
        "each configuration's best run and the spread between its runs; the explanations "
        "of missed targets use the runs of the median round.",
        "Throughput targets and scaling ratios use the steady-state rate (a training run "
        "lasts hours; start-up is reported as time to first batch): the tokens delivered "
        "between 25% and 75% of the run's tokens over the time they took, which leaves out "
        "start-up (worker spawn, pipeline fill: see time to first batch) and the lane-end "
        "drain; the finished work held in buffers (shuffle reservoirs, queues) is about the "
        "same at both ends of that window, so it cancels. It needs a run long against the "
        "shuffle reservoir (at most 15% of a lane's rows); a shorter run (`--quick`) falls back "
        "to whole-run rates. The whole-run ratio is shown too.",
        "Every figure is a ratio of two measurements taken in the same `make bench` run; "
        "tokens/s = CPU cores kept busy ÷ CPU seconds per token, and both factors are shown "
        "so a busy machine (fewer cores available) can be told from extra work per token.",
        "Long run: one pass over the whole corpus in-process (threads x2), RSS read after "
        "every batch; warm-up = the first 20% of the batches; growth = end vs. warm-up.",
        f"Resume: chunks of {work.resume_chunk_size} documents, k = {work.resume_k}; a run is "
        "consumed until every lane has delivered rows from the middle of its first epoch, "
        "checkpointed (all produced batches), closed, and a new `PipelineRun(plan, resume="
        "state)` is timed to its first batch; `stats()['replayed']` counts the packed rows the "
        "replay filter dropped. The first run writes a replay cache (as `zephon serve "
        "--state-dir` does) and the resumed runs read it; the same resume without it is "
        "timed too. Checkpoint RPC: `zephon serve` with a state directory, 8 "
        "batches read per lane, then 10 `Checkpoint` calls.",
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command's options (``--quick`` caps the corpus, the work and the resume chunks)."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=200_000, help="corpus size (documents)")
    parser.add_argument("--mean-words", type=int, default=250, help="mean words per document")
    parser.add_argument(
        "--token-budget", type=float, default=16e6, help="tokens of the fixed work (about)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds (each runs every configuration once)"
    )
    parser.add_argument("--shuffle-buffer", type=int, default=64, help="shuffle reservoir rows")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--k", type=int, default=8, help="flush_every_k_chunks")
    parser.add_argument("--resume-chunk-size", type=int, default=1024)
    parser.add_argument("--resume-k", type=int, default=8)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small and fast: 9000 documents, 1.5M-token work, resume chunks of 128",
    )
    parser.add_argument("--only", default="", help="comma-separated case keys (debugging)")
    parser.add_argument("--md", default=str(report.DOCS / "benchmarks.md"))
    parser.add_argument("--png", default=str(report.DOCS / "benchmarks.png"))
    parser.add_argument(
        "--no-readme",
        dest="readme",
        action="store_false",
        help="do not update the README's benchmark summary (between its bench-table markers)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.docs = min(args.docs, 9000)
        args.token_budget = min(args.token_budget, 1.5e6)
        args.resume_chunk_size = min(args.resume_chunk_size, 128)
    return args


def preload_allocator() -> dict[str, str]:
    """Make every child run with the allocator ``zephon serve`` picks (the glibc cases remove
    it) and the settings serve gives it (the trainer clients too); those settings."""
    if ALLOCATOR and ALLOCATOR not in os.environ.get("LD_PRELOAD", ""):
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [ALLOCATOR, os.environ.get("LD_PRELOAD")]))
    allocator_env = allocator.TUNING.get(allocator.name_of(ALLOCATOR), {}) if ALLOCATOR else {}
    os.environ.update(allocator.tuned_environ(allocator.name_of(ALLOCATOR), os.environ))
    return allocator_env


def prepare_workload(args: argparse.Namespace, work_dir: Path) -> Workload:
    """The corpus, tokenizer and fixed work in a fresh ``work_dir`` (``workload.json`` too)."""
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    log.info("preparing the workload (%d documents)", args.docs)
    work = prepare(
        docs=args.docs,
        mean_words=args.mean_words,
        token_budget=args.token_budget,
        chunk_size=args.chunk_size,
        k=args.k,
        shuffle_buffer=args.shuffle_buffer,
        resume_chunk_size=args.resume_chunk_size,
        resume_k=args.resume_k,
        work_dir=work_dir,
    )
    (work_dir / "workload.json").write_text(work.to_json())
    log.info(
        "fixed work: %d chunks per lane, %d documents, ~%.1f M tokens",
        work.chunks_per_lane,
        work.fixed_docs,
        work.fixed_docs * work.tokens_per_doc / 1e6,
    )
    return work


def selected_cases(only: str) -> list[Case]:
    """The throughput cases to run: all, or those ``--only`` names."""
    cases = THROUGHPUT_CASES
    if only:
        wanted = set(only.split(","))
        cases = [c for c in cases if c.key in wanted]
    return cases


def measure_rounds(
    cases: list[Case], work: Workload, work_dir: Path, repeat: int
) -> dict[str, list[dict[str, Any]]]:
    """Every case's runs, one per round, each round in :func:`round_order`."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(repeat):
        for case in round_order(cases, reverse=rep % 2 == 1):
            log.info("round %d: %s", rep + 1, case.label)
            result = case.measure(work, work_dir / f"{case.key}-{rep}")
            log.info(
                "  %.3f Mtokens/s (steady %.3f; %d tokens in %.2f s)",
                result["rate"] / 1e6,
                result.get("steady_rate", 0) / 1e6,
                result["tokens"],
                result["seconds"],
            )
            runs.setdefault(case.key, []).append(result)
    return runs


def measure_once(args: argparse.Namespace, work: Workload, work_dir: Path) -> dict[str, Any]:
    """The measurements taken once, as bench.json keeps them (all None with ``--only``): the
    long run, checkpoint and resume, the Checkpoint RPC, delivery cost, start-up."""
    once: dict[str, Any] = dict.fromkeys(
        ("long", "resume", "checkpoint_rpc", "delivery", "startup")
    )
    if args.only:
        return once
    log.info("long run (RSS)")
    once["long"] = measure_child("long", work, work_dir / "long")
    log.info("checkpoint and resume")
    once["resume"] = measure_child("resume", work, work_dir / "resume")
    log.info("Checkpoint RPC")
    once["checkpoint_rpc"] = checkpoint_rpc(work, work_dir / "checkpoint-rpc")
    log.info("delivery cost per batch")
    once["delivery"] = measure_child("delivery", work, work_dir / "delivery")
    log.info("start-up (bench.startup)")
    once["startup"] = startup.run(
        work_dir / "startup",
        rounds=min(args.repeat, 5),
        quick=args.quick,
        tokenizer=work.tokenizer,
    )
    return once


def fixed_tokens(best: dict[str, dict[str, Any]], cases: list[Case]) -> int:
    """The tokens of the fixed work: as threads x2 delivered them (else the first case)."""
    tokens = best[cases[0].key]["tokens"] if cases else 0
    if "engine_threads_2" in best:
        tokens = best["engine_threads_2"]["tokens"]
    return tokens


def workload_of(work: Workload) -> dict[str, Any]:
    """The workload as bench.json keeps it, with the fixed documents and the tokenizer's."""
    workload = asdict(work)
    workload.update(
        fixed_docs=work.fixed_docs, vocab_size=VOCAB_SIZE, tokenizer_sample=TOKENIZER_SAMPLE
    )
    return workload


def collect(
    argv: list[str],
    args: argparse.Namespace,
    started: float,
    mach: dict[str, Any],
    allocator_env: dict[str, str],
    work: Workload,
    cases: list[Case],
    runs: dict[str, list[dict[str, Any]]],
    once: dict[str, Any],
) -> dict[str, Any]:
    """Everything bench.json holds: the run, its machine and workload, every run, the
    ratios and figures, the measurements taken once and the method."""
    best = {key: max(rs, key=lambda r: r["rate"]) for key, rs in runs.items()}
    return {
        "command": command_line(argv),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": round(time.time() - started),
        "machine": mach,
        "allocator": ALLOCATOR,
        "allocator_env": {k: os.environ[k] for k in allocator_env},
        "workload": workload_of(work),
        "repeat": args.repeat,
        "fixed_tokens": fixed_tokens(best, cases),
        "cases": [
            {"key": c.key, "label": c.label, "short": c.short, "group": c.group} for c in cases
        ],
        "runs": runs,
        "best": best,
        "steady_valid": steady_valid(work),
        "ratios": [_ratio_row(r, runs, steady_valid(work)) for r in RATIOS],
        "figures": figures(best, runs, once["long"], once["resume"], once["checkpoint_rpc"]),
        **once,
        "method": method(work, args.repeat),
    }


def publish(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Write bench.json, the docs and (unless ``--no-readme``) the README summary; print the
    throughput and targets tables."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench.json").write_text(json.dumps(results, indent=1) + "\n")
    readme = report.ROOT / "README.md" if args.readme else None
    report.write(results, Path(args.md), Path(args.png), readme=readme)
    print()
    print(report.throughput_table(results))
    print()
    print(report.targets_table(results))
    print(
        f"\nwrote {RESULTS / 'bench.json'}, {args.md}, {args.png}"
        + (", README.md" if readme else "")
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.run``: measure everything, then write bench.json and the docs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # SIGTERM unwinds like Ctrl-C, so every child process is stopped by the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    started = time.time()
    compile_sources()  # the servers and clients it starts import compiled modules
    allocator_env = preload_allocator()
    mach = machine()
    work_dir = RESULTS / "run"
    work = prepare_workload(args, work_dir)
    cases = selected_cases(args.only)
    runs = measure_rounds(cases, work, work_dir, args.repeat)
    once = measure_once(args, work, work_dir)
    mach["load_after"] = list(os.getloadavg())
    results = collect(argv, args, started, mach, allocator_env, work, cases, runs, once)
    publish(results, args)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except subprocess.SubprocessError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        sys.exit(1)
