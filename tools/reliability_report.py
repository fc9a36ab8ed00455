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


def faults(rep: Report, work: Path, corpus: Path, long: bool, seed: int) -> None:
    from zephon_testing.scenarios import faults as tf
    from zephon_testing.servers import dump_digests

    cfg = tf.exact_config(work / "pipeline.yaml", corpus)
    ref = tf.reference_run(cfg)
    ref.check_covers_corpus()
    assert dump_digests(cfg, 100_000) == ref.chains, "reference differs from zephon dump"
    rng = random.Random(seed)

    # SIGKILL at random points.
    runs = 25 if long else 6
    kills = checked = 0
    totals: dict[str, int] = {}
    restart_s: list[float] = []
    recovery_s: list[float] = []
    during = 0
    for i in range(runs):
        points = {}
        for _ in range(rng.randint(1, 5 if long else 3)):
            at = rng.randint(1, ref.batches - 1)
            points[at] = tf.KillPoint(at, rng.randint(0, 40), rng.random() < 0.4)
        figures = tf.run_kill_scenario(cfg, ref, work / f"kill{i}", list(points.values()))
        tf.assert_exact_counts(figures)
        kills += figures["kills"]
        during += sum(p.during_checkpoint for p in points.values())
        checked += figures["batches"]
        for key in ("lost", "duplicated", "docs_lost", "docs_duplicated", "chain_mismatches"):
            totals[key] = totals.get(key, 0) + figures[key]
        restart_s += figures["restart_s"]
        recovery_s += figures["recovery_s"]
    rep.add(
        "## Faults",
        "",
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
            ["runs", runs],
            ["kill points survived", f"{kills} ({during} during a Checkpoint RPC)"],
            ["batches checked", checked],
            [
                "batches lost / duplicated",
                f"{totals['lost']} / {totals['duplicated']}",
            ],
            [
                "documents lost / duplicated",
                f"{totals['docs_lost']} / {totals['docs_duplicated']}",
            ],
            ["chain digest mismatches", totals["chain_mismatches"]],
            ["kill → restarted server listening", _fmt_s(restart_s)],
            ["kill → first batch from the new server (recovery)", _fmt_s(recovery_s)],
        ],
    )

    # SIGKILL during checkpoint writes.
    outcomes: dict[tuple[str, str, str], int] = {}
    for mode in ("overwrite", "save"):
        for stage in ("data-fsync", "rename", "dir-fsync"):
            f = tf.kill_writer(work, mode, 0.0, stage)
            key = (mode, f"at {stage}", f["latest"])
            outcomes[key] = outcomes.get(key, 0) + 1
        for _ in range(12 if long else 6):
            f = tf.kill_writer(work, mode, rng.randint(0, 300) / 1000)
            key = (mode, "random time", f["latest"])
            outcomes[key] = outcomes.get(key, 0) + 1
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

    # Network faults.
    rows = []
    for fault in ("latency", "bandwidth", "reset", "blackhole", "blackhole-default-keepalive"):
        f = tf.run_network_scenario(cfg, ref, work / f"net-{fault}", fault)
        tf.assert_exact_counts(f)
        rows.append(
            [
                fault,
                f["batches"],
                f"{f['lost']} / {f['duplicated']}",
                f["connections"],
                f["resets"],
                f"{f['detect_s'][0]:.1f} s" if f["detect_s"] else "-",
                f"{f['elapsed_s']:.1f} s",
            ]
        )
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
    rep.table(
        [
            "fault",
            "batches",
            "lost / duplicated",
            "TCP connections",
            "resets",
            "dead peer found",
            "elapsed",
        ],
        rows,
    )

    # Killed worker.
    rows = []
    for recovery in ("restart", "resume"):
        f = tf.run_worker_kill_scenario(cfg, ref, work / f"worker-{recovery}", recovery)
        tf.assert_exact_counts(f)
        assert f["health_after"] == "NOT_SERVING" and f["health_recovered"] == "SERVING"
        rows.append(
            [
                recovery,
                f"{f['fail_s']:.2f} s",
                f"{f['status']}: {f['message'].split(';')[0]}",
                f["health_after"],
                f"{f['recover_s']:.2f} s",
                f"{f['lost']} / {f['duplicated']}",
            ]
        )
    rep.add(
        "### A killed worker process (`--runner processes`)",
        "",
        "One spawn worker is SIGKILLed while the lanes stream. The streams fail with a clear "
        "status, health turns NOT_SERVING, the server process stays up. Recovery either by "
        "restarting with `--resume latest` or by the Resume RPC (latest checkpoint id) plus "
        "the trainer's own `load_state_dict`; the same client then continues exactly.",
        "",
    )
    rep.table(
        [
            "recovery",
            "kill → stream error",
            "status and message",
            "health",
            "recovery",
            "lost / duplicated",
        ],
        rows,
    )

    # Drain.
    d = tf.run_drain_scenario(cfg, work / "drain", grace=5.0)
    assert d["exit_code"] == 0
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
            [
                "stream endings",
                ", ".join(
                    sorted({f"{code} ({details})" for code, details, _, _ in d["streams"].values()})
                ),
            ],
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
    rep.table(
        ["figure", "value"],
        [
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
        ],
    )
    rep.add("### Slow consumer, cancellation, stream limit", "")
    rep.table(
        ["figure", "value"],
        [
            ["fast lanes, batches/s alone", ", ".join(f"{r:.0f}" for r in s["baseline_rates"][1:])],
            [
                "fast lanes, batches/s next to a slow one (5/s)",
                ", ".join(f"{r:.0f}" for r in s["mixed_rates"][1:])
                + f" (ratio {s['fast_ratio']:.2f})",
            ],
            [
                "cancelled stream blocked in the hub: streams, consumers, threads freed after",
                f"{c['freed_s'] * 1000:.0f} ms",
            ],
            ["stream beyond `--max-streams 3`", f"{lim['extra'][0]}: {lim['extra'][1]}"],
            ["health / GetInfo while at the limit", f"{lim['health']} / answered"],
        ],
    )


def bad_input(rep: Report, work: Path, corpus: Path, long: bool) -> None:
    from zephon_testing.scenarios import bad_input as tb

    by_code: dict[str, int] = {}
    with tb.running_servers(work / "bad", corpus) as running:
        for name, call, code, text in tb.CASES:
            tb.check_case(running, name, call, code, text)
            by_code[code.name] = by_code.get(code.name, 0) + 1
        fuzz = tb.run_fuzz(running, 400 if long else 150)
        corrupt = tb.check_corruptions(running.state)
    skip = tb.run_malformed_data(corpus, work / "malformed", "skip")
    fails = {
        damage or ("bad lines",): tb.run_malformed_data(corpus, work / "malformed", "fail", damage)
        for damage in ((), ("vanish",), ("unreadable",))
    }
    fuzz_codes: dict[str, int] = {}
    for (_, code), n in fuzz["codes"].items():
        fuzz_codes[code] = fuzz_codes.get(code, 0) + n
    rep.add(
        "## Bad input",
        "",
        f"* **Status table**: {len(tb.CASES)} error cases over every RPC "
        f"({', '.join(f'{k} {v}' for k, v in sorted(by_code.items()))}); each with its "
        "DESIGN §5 code, a message naming the problem, no traceback, nothing changed, the "
        "server healthy afterwards.",
        f"* **Random requests** (hypothesis): {fuzz['requests']} random or malformed "
        "StreamBatches / Checkpoint / Resume requests and raw undecodable bodies; outcomes "
        f"{', '.join(f'{k} {v}' for k, v in sorted(fuzz_codes.items()))} (INTERNAL only for "
        "undecodable bodies: gRPC's own deserialization error); never UNKNOWN, the server "
        "healthy and lane 0 unchanged afterwards.",
        f"* **Corrupt checkpoints**: {corrupt['cases']} cases (every truncation and every "
        "single-bit flip of a real checkpoint, the empty file included) all rejected: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(corrupt['by_status'].items()))}, each "
        "message naming expected and found values.",
        "",
    )
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
