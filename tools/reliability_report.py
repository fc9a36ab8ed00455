"""Run the reliability scenarios and write ``docs/reliability.md`` with their figures.

    python tools/reliability_report.py                 # CI sizes, a few minutes
    python tools/reliability_report.py --tier long     # more kill points, 2-minute load hold

It runs the scenario functions of the reliability tests (``tools/zephon_testing/scenarios``:
those of ``tests/reliability/test_faults.py``, ``test_load.py``, ``test_bad_input.py``,
``test_security.py``, and for the hardening section those that
``tools/reliability_hardening.py`` lists) without pytest, on a fresh sample corpus
in a temporary directory; every server it starts listens on 127.0.0.1 and is
stopped before it returns. Any failed check aborts the run (no report with wrong figures).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _fmt_s(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s (n={len(values)})"


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.lines.append("| " + " | ".join(header) + " |")
        self.lines.append("|" + "---|" * len(header))
        for row in rows:
            self.lines.append("| " + " | ".join(str(c) for c in row) + " |")
        self.lines.append("")


_EXACT_KEYS = ("lost", "duplicated", "docs_lost", "docs_duplicated", "chain_mismatches")


def faults(rep: Report, work: Path, corpus: Path, long: bool, seed: int) -> None:
    """The "Faults" section: one subsection per scenario of ``test_faults.py``, all over the
    exact-ledger config and its reference run (checked equal to ``zephon dump``)."""
    from zephon_testing.scenarios import faults as tf
    from zephon_testing.servers import dump_digests

    cfg = tf.exact_config(work / "pipeline.yaml", corpus)
    ref = tf.reference_run(cfg)
    ref.check_covers_corpus()
    assert dump_digests(cfg, 100_000) == ref.chains, "reference differs from zephon dump"
    rng = random.Random(seed)
    rep.add("## Faults", "")
    _server_kills(rep, cfg, ref, work, long, rng)
    _checkpoint_write_kills(rep, work, long, rng)
    _network_faults(rep, cfg, ref, work)
    _worker_kills(rep, cfg, ref, work)
    _drain(rep, cfg, work)


def _kill_points(rng: random.Random, batches: int, long: bool) -> list[Any]:
    """One to three (long tier: five) kill points at distinct batch counts."""
    from zephon_testing.scenarios.faults import KillPoint

    points = {}
    for _ in range(rng.randint(1, 5 if long else 3)):
        at = rng.randint(1, batches - 1)
        points[at] = KillPoint(at, rng.randint(0, 40), rng.random() < 0.4)
    return list(points.values())


def _kill_runs(cfg: Path, ref: Any, work: Path, long: bool, rng: random.Random) -> dict[str, Any]:
    """Run the SIGKILL scenario at random kill points; the figures summed over the runs."""
    from zephon_testing.scenarios import faults as tf

    runs = 25 if long else 6
    sums: dict[str, Any] = {"runs": runs, "kills": 0, "during": 0, "batches": 0}
    sums.update(dict.fromkeys(_EXACT_KEYS, 0), restart_s=[], recovery_s=[])
    for i in range(runs):
        points = _kill_points(rng, ref.batches, long)
        figures = tf.run_kill_scenario(cfg, ref, work / f"kill{i}", points)
        tf.assert_exact_counts(figures)
        sums["during"] += sum(p.during_checkpoint for p in points)
        for key in ("kills", "batches", *_EXACT_KEYS, "restart_s", "recovery_s"):
            sums[key] += figures[key]
    return sums


def _server_kills(
    rep: Report, cfg: Path, ref: Any, work: Path, long: bool, rng: random.Random
) -> None:
    k = _kill_runs(cfg, ref, work, long, rng)
    rep.add(
        "### SIGKILL of the server, restart with `--resume latest`",
        "",
        f"One `DataClient` reads all {len(ref.chains)} lanes of a finite corpus "
        f"({ref.batches} batches, {len(ref.documents)} documents) and asks for a server "
        "checkpoint every 6 batches; the server is SIGKILLed at random points (some while a "
        "Checkpoint RPC is in flight) and restarted on the same port with `--resume latest`. "
        "The client's ledger (every `(lane, seq)`, chain digest and `batch.closed` document) is "
        "compared with an uninterrupted run equal to `zephon dump`.",
        "",
    )
    rep.table(
        ["figure", "value"],
        [
            ["runs", k["runs"]],
            ["kill points survived", f"{k['kills']} ({k['during']} during a Checkpoint RPC)"],
            ["batches checked", k["batches"]],
            ["batches lost / duplicated", f"{k['lost']} / {k['duplicated']}"],
            ["documents lost / duplicated", f"{k['docs_lost']} / {k['docs_duplicated']}"],
            ["chain digest mismatches", k["chain_mismatches"]],
            ["kill → restarted server listening", _fmt_s(k["restart_s"])],
            ["kill → first batch from the new server (recovery)", _fmt_s(k["recovery_s"])],
        ],
    )


def _writer_outcomes(work: Path, long: bool, rng: random.Random) -> Counter[tuple[str, ...]]:
    """(mode, kill point, newest checkpoint afterwards) of every killed checkpoint writer."""
    from zephon_testing.scenarios import faults as tf

    outcomes: Counter[tuple[str, ...]] = Counter()
    for mode in ("overwrite", "save"):
        for stage in ("data-fsync", "rename", "dir-fsync"):
            outcomes[(mode, f"at {stage}", tf.kill_writer(work, mode, 0.0, stage)["latest"])] += 1
        for _ in range(12 if long else 6):
            f = tf.kill_writer(work, mode, rng.randint(0, 300) / 1000)
            outcomes[(mode, "random time", f["latest"])] += 1
    return outcomes


def _checkpoint_write_kills(rep: Report, work: Path, long: bool, rng: random.Random) -> None:
    outcomes = _writer_outcomes(work, long, rng)
    rep.add(
        "### SIGKILL during a checkpoint write",
        "",
        "A subprocess rewrites a ~0.6 MB checkpoint in a loop (`overwrite`: the same file via "
        "`write_atomic`; `save`: new ids via `CheckpointStore.save`), killed just before the "
        "data fsync, the rename or the directory fsync, or at random times. Afterwards "
        "`CheckpointStore` removed every stray temp file and every checkpoint loaded intact "
        "as exactly the old or the new one (byte-identical), never a mix.",
        "",
    )
    rep.table(
        ["mode", "kill point", "newest checkpoint afterwards", "runs"],
        [[m, p, latest, n] for (m, p, latest), n in sorted(outcomes.items())],
    )


def _network_row(fault: str, f: dict[str, Any]) -> list[Any]:
    return [
        fault,
        f["batches"],
        f"{f['lost']} / {f['duplicated']}",
        f["connections"],
        f["resets"],
        f"{f['detect_s'][0]:.1f} s" if f["detect_s"] else "-",
        f"{f['elapsed_s']:.1f} s",
    ]


def _network_faults(rep: Report, cfg: Path, ref: Any, work: Path) -> None:
    from zephon_testing.scenarios import faults as tf

    rows = []
    for fault in ("latency", "bandwidth", "reset", "blackhole", "blackhole-default-keepalive"):
        f = tf.run_network_scenario(cfg, ref, work / f"net-{fault}", fault)
        tf.assert_exact_counts(f)
        rows.append(_network_row(fault, f))
    rep.add(
        "### Network faults (TCP fault proxy on 127.0.0.1)",
        "",
        "`tools/zephon_testing/fault_proxy.py` sits between client and server: 25 ms added "
        "latency each way; 400 kB/s per direction; connection reset (RST) after 150 kB, three "
        "times; black hole "
        "(all traffic of the open connection silently dropped) after a third of the batches, "
        "detected by keepalive (test options: 1 s ping, 1 s timeout; and the client's shipped "
        "defaults: 10 s ping, 5 s timeout). Server `--max-ahead 4`.",
        "",
    )
    header = ["fault", "batches", "lost / duplicated", "TCP connections", "resets"]
    rep.table([*header, "dead peer found", "elapsed"], rows)


def _worker_row(recovery: str, f: dict[str, Any]) -> list[Any]:
    return [
        recovery,
        f"{f['fail_s']:.2f} s",
        f"{f['status']}: {f['message'].split(';')[0]}",
        f["health_after"],
        f"{f['recover_s']:.2f} s",
        f"{f['lost']} / {f['duplicated']}",
    ]


def _worker_kills(rep: Report, cfg: Path, ref: Any, work: Path) -> None:
    from zephon_testing.scenarios import faults as tf

    rows = []
    for recovery in ("restart", "resume"):
        f = tf.run_worker_kill_scenario(cfg, ref, work / f"worker-{recovery}", recovery)
        tf.assert_exact_counts(f)
        assert f["health_after"] == "NOT_SERVING" and f["health_recovered"] == "SERVING"
        rows.append(_worker_row(recovery, f))
    rep.add(
        "### A killed worker process (`--runner processes`)",
        "",
        "One spawn worker is SIGKILLed while the lanes stream. The streams fail with a clear "
        "status, health turns NOT_SERVING, the server process stays up. Recovery either by "
        "restarting with `--resume latest` or by the Resume RPC (latest checkpoint id) plus "
        "the trainer's own `load_state_dict`; the same client then continues exactly.",
        "",
    )
    header = ["recovery", "kill → stream error", "status and message", "health", "recovery"]
    rep.table([*header, "lost / duplicated"], rows)


def _drain(rep: Report, cfg: Path, work: Path) -> None:
    from zephon_testing.scenarios import faults as tf

    d = tf.run_drain_scenario(cfg, work / "drain", grace=5.0)
    assert d["exit_code"] == 0
    endings = sorted({f"{code} ({details})" for code, details, _, _ in d["streams"].values()})
    rep.add(
        "### SIGTERM drain (`--drain-grace 5`)",
        "",
        "Four lanes mid-stream and a health `Watch`:",
        "",
    )
    rep.table(
        ["figure", "value"],
        [
            ["SIGTERM → health NOT_SERVING", f"{d['not_serving_s'] * 1000:.0f} ms"],
            ["stream endings", ", ".join(endings)],
            [
                "SIGTERM → last stream ended (client side)",
                f"{max(at for _, _, at, _ in d['streams'].values()):.2f} s",
            ],
            ["SIGTERM → process exit", f"{d['exit_s']:.2f} s, exit code {d['exit_code']}"],
        ],
    )


def load(rep: Report, work: Path, corpus: Path, long: bool) -> None:
    from zephon_testing.scenarios import load as tl

    f = tl.run_streams_load(corpus, work / "load", streams=64, hold_s=120.0 if long else 20.0)
    assert not f["errors"] and f["ended"] == 0
    s = tl.run_slow_consumer(corpus, work / "slow")
    c = tl.run_cancel_scenario(corpus, work / "cancel")
    lim = tl.run_stream_limit(corpus, work / "limit")
    rep.add(
        "## Load",
        "",
        f"### {f['streams']} concurrent lane streams for {f['hold_s']:.0f} s",
        "",
        "One stream per lane over 8 channels, each reading and acknowledging as fast as it can "
        "(byte tokenizer, 128-token rows, 2 rows per batch, repeating corpus); the server's "
        "RSS, threads and file descriptors sampled every 0.25 s, the first 40 % counted as "
        "warm-up. The next-batch wait is the time a reader waited for each next message after "
        "warm-up (production-bound on this machine: a lane's batches come in bursts, one chunk "
        "at a time, while the other 63 lanes get theirs).",
        "",
    )
    rep.table(["figure", "value"], _streams_rows(f))
    rep.add("### Slow consumer, cancellation, stream limit", "")
    rep.table(["figure", "value"], _stream_limits_rows(s, c, lim))


def _streams_rows(f: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            "streams held / errors / ended early",
            f"{f['streams']} / {len(f['errors'])} / {f['ended']}",
        ],
        [
            "batches received",
            f"{f['batches']} ({f['batches_per_s']:.0f}/s, "
            f"at least {f['min_batches_per_stream']} per stream)",
        ],
        ["next-batch wait p50 / p99", f"{f['wait_p50_ms']:.1f} ms / {f['wait_p99_ms']:.0f} ms"],
        [
            "RSS after warm-up (first half → second half median)",
            f"{f['rss_mb'][0]:.1f} → {f['rss_mb'][1]:.1f} MB ({f['rss_growth_mb']:+.1f} MB)",
        ],
        ["threads after warm-up (min-max)", f"{f['threads'][0]}-{f['threads'][1]}"],
        ["file descriptors after warm-up (min-max)", f"{f['fds'][0]}-{f['fds'][1]}"],
        ["health at the end", f["health"]],
    ]


def _stream_limits_rows(
    s: dict[str, Any], c: dict[str, Any], lim: dict[str, Any]
) -> list[list[Any]]:
    """Rows of the slow consumer (``s``), cancellation (``c``) and stream limit (``lim``)."""
    return [
        ["fast lanes, batches/s alone", ", ".join(f"{r:.0f}" for r in s["baseline_rates"][1:])],
        [
            "fast lanes, batches/s next to a slow one (5/s)",
            ", ".join(f"{r:.0f}" for r in s["mixed_rates"][1:]) + f" (ratio {s['fast_ratio']:.2f})",
        ],
        [
            "cancelled stream blocked in the hub: streams, consumers, threads freed after",
            f"{c['freed_s'] * 1000:.0f} ms",
        ],
        ["stream beyond `--max-streams 3`", f"{lim['extra'][0]}: {lim['extra'][1]}"],
        ["health / GetInfo while at the limit", f"{lim['health']} / answered"],
    ]


def bad_input(rep: Report, work: Path, corpus: Path, long: bool) -> None:
    from zephon_testing.scenarios import bad_input as tb

    by_code: Counter[str] = Counter()
    with tb.running_servers(work / "bad", corpus) as running:
        for name, call, code, text in tb.CASES:
            tb.check_case(running, name, call, code, text)
            by_code[code.name] += 1
        fuzz = tb.run_fuzz(running, 400 if long else 150)
        corrupt = tb.check_corruptions(running.state)
    skip = tb.run_malformed_data(corpus, work / "malformed", "skip")
    fails: dict[tuple[str, ...], dict[str, Any]] = {
        damage or ("bad lines",): tb.run_malformed_data(corpus, work / "malformed", "fail", damage)
        for damage in ((), ("vanish",), ("unreadable",))
    }
    fuzz_codes: Counter[str] = Counter()
    for (_, code), n in fuzz["codes"].items():
        fuzz_codes[code] += n
    rep.add(
        "## Bad input",
        "",
        f"* **Status table**: {len(tb.CASES)} error cases over every RPC "
        f"({_counts(by_code)}); each with its "
        "DESIGN §5 code, a message naming the problem, no traceback, nothing changed, the "
        "server healthy afterwards.",
        f"* **Random requests** (hypothesis): {fuzz['requests']} random or malformed "
        "StreamBatches / Checkpoint / Resume requests and raw undecodable bodies; outcomes "
        f"{_counts(fuzz_codes)} (INTERNAL only for "
        "undecodable bodies: gRPC's own deserialization error); never UNKNOWN, the server "
        "healthy and lane 0 unchanged afterwards.",
        f"* **Corrupt checkpoints**: {corrupt['cases']} cases (every truncation and every "
        "single-bit flip of a real checkpoint, the empty file included) all rejected: "
        f"{_counts(corrupt['by_status'])}, each "
        "message naming expected and found values.",
        "",
    )
    _malformed_data(rep, skip, fails)


def _counts(counts: dict[str, int]) -> str:
    """``NAME n, NAME n`` in name order."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _malformed_data(
    rep: Report, skip: dict[str, Any], fails: dict[tuple[str, ...], dict[str, Any]]
) -> None:
    m = skip["metrics"]
    rep.add(
        "### Malformed data end to end",
        "",
        "A dataset with bad JSON, a missing field, invalid UTF-8, a JSON array, a non-string "
        "text, an empty and a 300 kB document, plus two shards removed / replaced by a "
        "directory after the server started:",
        "",
    )
    rep.table(
        ["policy", "outcome"],
        [
            [
                "`on_error: skip`",
                f"{len(skip['closed'])} documents closed on the wire, none twice "
                f"({sum(len(e.closed) for e in skip['ends'].values())} of them dropped after "
                "their lane's last batch, in its `EndOfStream`); every drop on /metrics "
                "reached the client with its reason: "
                f'`zephon_records_skipped_total{{dataset="bad"}}` {m["skipped"]:.0f} '
                f"(malformed {m['malformed']:.0f}, read_error {m['read_error']:.0f})",
            ],
            *[
                [f"`on_error: fail`, {' '.join(k)}", f"{f['error'][0]}: {f['error'][1]}"]
                for k, f in fails.items()
            ],
        ],
    )


def security(rep: Report, work: Path, corpus: Path) -> None:
    from zephon_testing.scenarios import security as ts
    from zephon_testing.servers import write_config

    pki = ts.make_pki(work / "pki")
    cfg = write_config(work / "sec.yaml", corpus)
    results = ts.run_security_matrix(cfg, work, pki)
    assert results == ts.EXPECTED, results
    rep.add(
        "## Security",
        "",
        "Certificates generated at run time (EC P-256 CA, server certificate for localhost / "
        "127.0.0.1, client certificates from that CA and from an untrusted one).",
        "",
    )
    rep.table(["server / client", "outcome"], [[k, v] for k, v in results.items()])


KNOWN_ISSUES = [
    "The next-batch p99 at 64 lanes on 2 CPUs is the production burst interval (a lane gets a "
    "chunk's batches at once, then waits for the other lanes' chunks), not a stall.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tier", choices=("ci", "long"), default="ci")
    parser.add_argument("--output", default=str(REPO / "docs" / "reliability.md"))
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    long = args.tier == "long"
    os.environ["ZEPHON_RELIABILITY_TIER"] = args.tier

    import grpc
    from reliability_hardening import HARDENING_TESTS, hardening

    from zephon_server.engine.corpus import write_sample_corpus

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="zephon-reliability-"))
    try:
        corpus = work / "corpus"
        write_sample_corpus(corpus, docs_per_dataset=600 if long else 150, seed=7)
        body = Report()
        faults(body, work, corpus, long, args.seed)
        load(body, work, corpus, long)
        bad_input(body, work, corpus, long)
        hardening(body, work, corpus)
        security(body, work, corpus)
        body.add("## Known issues", "", *[f"* {issue}" for issue in KNOWN_ISSUES], "")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    head = Report()
    head.add(
        "# Reliability",
        "",
        "Generated by `python tools/reliability_report.py"
        + (" --tier long" if long else "")
        + "`; do not edit by hand. The same scenarios run as tests "
        "(under `tests/`: `reliability/test_faults.py`, `reliability/test_load.py`, "
        "`reliability/test_bad_input.py`, `reliability/test_security.py`, "
        + ", ".join(f"`{name}`" for name in HARDENING_TESTS)
        + "; `ZEPHON_RELIABILITY_TIER=long` for the longer tier).",
        "",
        f"Run: {datetime.date.today().isoformat()}, commit {commit or '?'} (plus working "
        f"tree), tier `{args.tier}`, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, grpcio {grpc.__version__}, "
        f"{time.monotonic() - started:.0f} s.",
        "",
    )
    Path(args.output).write_text("\n".join(head.lines + body.lines).rstrip() + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
