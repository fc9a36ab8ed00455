"""The benchmark's configurations: throughput cases and the ratios reported between them.

:data:`THROUGHPUT_CASES` is the list of throughput measurements (each a fresh child process
or a server with clients) and :data:`RATIOS` the ratios taken between them; extend either with
one line, e.g.::

    THROUGHPUT_CASES.append(engine_case("processes", 4))
    RATIOS.append(Ratio("proc4", "processes x4 / x2", "engine_processes_4", "engine_processes_2"))
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_server.runtime import allocator

from .service import service_throughput, spawn, stop, tail
from .workload import MAX_LENGTH, Workload


@dataclass
class Case:
    """One throughput configuration: ``measure(work, run_dir)`` returns a dict with ``rate``
    (tokens/s), ``tokens``, ``seconds`` and whatever else it knows (``cores``, ``ttfb``...)."""

    key: str
    label: str
    short: str  # chart label
    group: str  # "tokenizer", "engine" or "service"
    measure: Callable[[Workload, Path], dict[str, Any]]


def measure_child(
    kind: str, work: Workload, run_dir: Path, *extra: str, env: dict[str, str | None] | None = None
) -> dict[str, Any]:
    """Run ``python -m bench.measure kind`` in a fresh process (``env``: changes to the
    environment, None removes a variable); its JSON result."""
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "result.json"
    out.unlink(missing_ok=True)
    args = ["-m", "bench.measure", kind, "--workload", str(Path(work.work_dir) / "workload.json")]
    proc = spawn([*args, "--out", str(out), *extra], run_dir / "child.log", env=env)
    try:
        code = proc.wait(timeout=4 * 3600)
    finally:
        stop(proc, 10)
    if code != 0 or not out.exists():
        output = tail(run_dir / "child.log")
        raise RuntimeError(f"bench.measure {kind} {extra} failed ({code}):\n{output}")
    return json.loads(out.read_text())


def bench_allocator(environ: dict[str, str] | None = None) -> str | None:
    """The allocator library the cases run with: one already in ``LD_PRELOAD``, else the one
    ``zephon serve --allocator auto`` picks on this machine (None: glibc's malloc)."""
    env = os.environ if environ is None else environ
    preloaded = [p for p in env.get("LD_PRELOAD", "").split(":") if allocator.is_allocator(p)]
    return preloaded[0] if preloaded else allocator.resolve("auto", {}).library


ALLOCATOR = bench_allocator()
"""The allocator library every case runs with (``bench.run`` preloads it for its children)."""
GLIBC: dict[str, str | None] = {"LD_PRELOAD": None}
"""The environment change that runs a case on glibc's malloc instead (the ``_glibc`` cases)."""


def tokenizer_case(threads: int, *, glibc: bool = False) -> Case:
    noun = "thread" if threads == 1 else "threads"
    return Case(
        f"tokenizer_{threads}" + ("_glibc" if glibc else ""),
        f"tokenizer only, {threads} {noun}" + (", glibc malloc" if glibc else ""),
        f"tokenizer x{threads}" + (", glibc" if glibc else ""),
        "tokenizer",
        lambda work, d: measure_child(
            "tokenizer", work, d, "--threads", str(threads), env=GLIBC if glibc else None
        ),
    )


def engine_case(runner: str, workers: int, *, glibc: bool = False) -> Case:
    label = "inline" if runner == "inline" else f"{runner} x{workers}"
    return Case(
        f"engine_{runner}_{workers}" + ("_glibc" if glibc else ""),
        f"engine in-process, {label}" + (", glibc malloc" if glibc else ""),
        label + (", glibc" if glibc else ""),
        "engine",
        lambda work, d: measure_child(
            "engine",
            work,
            d,
            "--runner",
            runner,
            "--workers",
            str(workers),
            env=GLIBC if glibc else None,
        ),
    )


def service_case(
    ranks: int, *, state_dir: bool = False, glibc: bool = False, ring: bool = True
) -> Case:
    """The service with ``ranks`` client processes on this host; ``ring``: tensor bytes through
    the shared-memory rings (the default), else in the gRPC messages (``--shm-ring-mib 0``)."""
    noun = "rank" if ranks == 1 else "ranks"
    suffix = ", --state-dir (replay cache on)" if state_dir else ""
    suffix += ", glibc malloc" if glibc else ""
    suffix += "" if ring else ", tensor bytes in the messages (--shm-ring-mib 0)"
    return Case(
        f"service_{ranks}"
        + ("_state" if state_dir else "")
        + ("_glibc" if glibc else "")
        + ("" if ring else "_noring"),
        f"service over loopback gRPC, {ranks} client {noun}{suffix}",
        f"service, {ranks} {noun}"
        + (", state" if state_dir else "")
        + (", glibc" if glibc else "")
        + ("" if ring else ", no ring"),
        "service",
        lambda work, d: service_throughput(
            work,
            ranks,
            d,
            state_dir=state_dir,
            env=GLIBC if glibc else None,
            server_args=() if ring else ("--shm-ring-mib", "0"),
        ),
    )


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


GLIBC_CASES = [
    tokenizer_case(2, glibc=True),
    engine_case("threads", 2, glibc=True),
    service_case(1, glibc=True),
]
"""The cases run again on glibc's malloc, to show what the preloaded allocator changes."""

THROUGHPUT_CASES: list[Case] = [
    tokenizer_case(1),
    tokenizer_case(2),
    engine_case("inline", 1),
    engine_case("threads", 1),
    engine_case("threads", 2),
    engine_case("processes", 1),
    engine_case("processes", 2),
    *([engine_case("ray", 1), engine_case("ray", 2)] if _has_ray() else []),
    service_case(1),
    service_case(2),
    service_case(1, state_dir=True),
    service_case(1, ring=False),
    *(GLIBC_CASES if ALLOCATOR else []),
]
"""The throughput measurements, in table order (a hook: append e.g. ``engine_case(...)``).
The Ray rows (a private local Ray started by each run) appear when Ray is installed; the
glibc malloc rows when an allocator is preloaded (:data:`ALLOCATOR`)."""

ROUND_ORDER = [
    "tokenizer_1",
    "engine_inline_1",
    "engine_threads_1",
    "tokenizer_2_glibc",
    "service_1_glibc",
    "engine_threads_2_glibc",
    "engine_threads_2",
    "service_1",
    "tokenizer_2",
    "service_2",
    "service_1_noring",
    "service_1_state",
    "engine_processes_1",
    "engine_processes_2",
    "engine_ray_1",
    "engine_ray_2",
]
"""The order of the cases within a round: the two sides of each target ratio run next to
each other (threads x2 | service 1 rank | tokenizer x2 | service 2 ranks; processes x1 | x2),
so a ratio taken within a round compares runs seconds apart, whatever the machine's speed is
doing over minutes. Cases not listed run last, in table order."""


@dataclass
class Ratio:
    """``numerator / denominator`` of two cases' rates; ``target`` (a minimum) if any."""

    key: str
    label: str
    numerator: str
    denominator: str
    target: float | None = None
    target_text: str = ""
    style: str = "x"  # "x": 0.93 ; "below": 0.93 (7% below) ; "times": 1.85x
    note: str = ""
    field: str = "rate"  # "rate" (whole run) or "steady_rate" (middle half, if valid)


RATIOS: list[Ratio] = [
    Ratio(
        "service_vs_tokenizer",
        "service end-to-end (1 rank) / tokenizer-only, 2 threads (steady state)",
        "service_1",
        "tokenizer_2",
        0.90,
        "≥ 0.90",
        field="steady_rate",
    ),
    Ratio(
        "service2_vs_tokenizer",
        "service end-to-end (2 ranks) / tokenizer-only, 2 threads (steady state)",
        "service_2",
        "tokenizer_2",
        0.90,
        "≥ 0.90",
        field="steady_rate",
    ),
    Ratio(
        "grpc_delivery",
        "gRPC delivery: service (1 rank; tensor bytes through the same-host shared-memory ring) "
        "/ in-process threads x2, same pipeline (steady state)",
        "service_1",
        "engine_threads_2",
        0.95,
        "≤ 5% below",
        style="below",
        field="steady_rate",
    ),
    Ratio(
        "grpc_delivery_noring",
        "delivery with the tensor bytes in the gRPC messages: service (1 rank, --shm-ring-mib 0) "
        "/ in-process threads x2 (steady state)",
        "service_1_noring",
        "engine_threads_2",
        style="below",
        field="steady_rate",
    ),
    Ratio(
        "processes_scaling",
        "processes runner, 1 → 2 workers (steady state)",
        "engine_processes_2",
        "engine_processes_1",
        1.7,
        "≥ 1.7x",
        style="times",
        field="steady_rate",
    ),
    Ratio(
        "processes_scaling_whole",
        "processes runner, 1 → 2 workers (whole run, worker start-up included)",
        "engine_processes_2",
        "engine_processes_1",
        style="times",
    ),
    Ratio(
        "replay_cache_cost",
        "service with --state-dir (replay cache written) / without (steady state)",
        "service_1_state",
        "service_1",
        field="steady_rate",
    ),
    Ratio(
        "service_vs_tokenizer_whole",
        "service (1 rank) / tokenizer-only, 2 threads (whole run, server start-up included)",
        "service_1",
        "tokenizer_2",
    ),
    Ratio(
        "engine_vs_tokenizer",
        "engine in-process threads x2 / tokenizer-only, 2 threads (steady state)",
        "engine_threads_2",
        "tokenizer_2",
        field="steady_rate",
    ),
    Ratio(
        "engine_vs_tokenizer_whole",
        "engine in-process threads x2 / tokenizer-only, 2 threads (whole run)",
        "engine_threads_2",
        "tokenizer_2",
    ),
    Ratio(
        "inline_vs_tokenizer1",
        "engine inline / tokenizer-only, 1 thread (single-core efficiency)",
        "engine_inline_1",
        "tokenizer_1",
    ),
    Ratio(
        "threads_scaling",
        "threads runner, 1 → 2 workers (steady state)",
        "engine_threads_2",
        "engine_threads_1",
        style="times",
        field="steady_rate",
    ),
    Ratio(
        "ray_scaling",
        "Ray runner, 1 → 2 workers (steady state)",
        "engine_ray_2",
        "engine_ray_1",
        style="times",
        field="steady_rate",
    ),
    Ratio(
        "ray_vs_threads",
        "Ray x2 / threads x2, in-process (steady state)",
        "engine_ray_2",
        "engine_threads_2",
        field="steady_rate",
    ),
    Ratio(
        "tokenizer_scaling",
        "tokenizer-only, 1 → 2 threads (this machine's own scaling)",
        "tokenizer_2",
        "tokenizer_1",
        style="times",
    ),
    Ratio(
        "service_ranks",
        "service, 2 ranks / 1 rank",
        "service_2",
        "service_1",
        style="times",
    ),
    Ratio(
        "allocator_engine",
        "engine in-process threads x2, preloaded allocator / glibc malloc (steady state)",
        "engine_threads_2",
        "engine_threads_2_glibc",
        style="times",
        field="steady_rate",
    ),
    Ratio(
        "service_vs_tokenizer_glibc",
        "service (1 rank) / tokenizer-only, 2 threads, both on glibc malloc (steady state)",
        "service_1_glibc",
        "tokenizer_2_glibc",
        field="steady_rate",
    ),
    Ratio(
        "grpc_delivery_glibc",
        "gRPC delivery on glibc malloc: service (1 rank) / in-process threads x2 (steady state)",
        "service_1_glibc",
        "engine_threads_2_glibc",
        style="below",
        field="steady_rate",
    ),
    Ratio(
        "allocator_service",
        "service (1 rank), preloaded allocator / glibc malloc (steady state)",
        "service_1",
        "service_1_glibc",
        style="times",
        field="steady_rate",
    ),
    Ratio(
        "allocator_tokenizer",
        "tokenizer-only, 2 threads, preloaded allocator / glibc malloc",
        "tokenizer_2",
        "tokenizer_2_glibc",
        style="times",
    ),
]
"""The ratios reported (a hook, like :data:`THROUGHPUT_CASES`)."""


def steady_valid(work: Workload) -> bool:
    """Whether the fixed work is long enough for a steady-state window (see measure.steady_rate):
    a lane's shuffle reservoir (drained at the lane's end) holds at most 15% of its rows."""
    rows_per_lane = work.chunks_per_lane * work.chunk_size * work.tokens_per_doc / MAX_LENGTH
    return work.shuffle_buffer <= 0.15 * rows_per_lane
