"""The "Hardening" section of ``docs/reliability.md`` (issue 19), called by
``tools/reliability_report.py``.

It runs the scenario functions (``tools/zephon_testing/scenarios``) of the issue's tests
(``tests/reliability/test_shard_integrity.py``, ``test_shard_identity_service.py``,
``test_client_identity.py``, ``test_startup.py``, ``test_request_limits.py``,
``test_disk_full.py``, ``test_bad_records.py``, ``test_crash_cleanup.py``,
``tests/service/test_metrics_http.py``): each checks what its test checks and
returns what it measured, which is rendered here. A failed check raises and aborts the run.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

#: The test modules (under ``tests/``) whose scenario functions this section runs.
HARDENING_TESTS = (
    "reliability/test_shard_integrity.py",
    "reliability/test_shard_identity_service.py",
    "reliability/test_client_identity.py",
    "reliability/test_startup.py",
    "reliability/test_request_limits.py",
    "reliability/test_disk_full.py",
    "reliability/test_bad_records.py",
    "reliability/test_crash_cleanup.py",
    "reliability/test_memory_bound.py",
    "service/test_replays.py",
    "service/test_metrics_http.py",
)
_LOG_PREFIX = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\w+) [\w.]+: ")


class Report(Protocol):
    """What ``reliability_report.Report`` offers: lines and Markdown tables."""

    def add(self, *lines: str) -> None: ...

    def table(self, header: list[str], rows: list[list[Any]]) -> None: ...


class Short:
    """Shortens messages for a table cell: the first line, the run's work directory as
    ``<work>``, a log line's time and logger dropped, at most ``limit`` characters."""

    def __init__(self, work: Path, limit: int = 220) -> None:
        self.work = str(work)
        self.limit = limit

    def __call__(self, text: str, limit: int | None = None) -> str:
        line = text.strip().splitlines()[0] if text.strip() else ""
        line = _LOG_PREFIX.sub(r"\1: ", line).replace(self.work, "<work>")
        line = line.replace("|", "\\|")
        cut = limit or self.limit
        return line if len(line) <= cut else line[: cut - 1].rstrip() + "…"


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _counts(counter: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items()))


# Why a checkpoint file was refused, from its reason in a "no usable checkpoint" line.
_REASONS = [
    ("checksum mismatch", "checksum mismatch"),
    ("is truncated", "truncated"),
    ("not a Zephon checkpoint", "not a checkpoint"),
    ("is a directory", "directory"),
    ("another pipeline", "another pipeline"),
    ("does not match the data", "data changed"),
    ("signature does not match", "bad signature"),
    ("is not signed", "unsigned"),
]


def refusals(line: str) -> tuple[int, Counter[str], int]:
    """(files refused, refused by reason, older files not tried) of a ``--resume latest``
    start-up failure; checks the reasons add up to the count the line gives."""
    found = re.search(r"\((\d+) refused: (.*)\)", line)
    assert found, line
    total = int(found.group(1))
    by_reason: Counter[str] = Counter()
    for part in re.split(r"; (?=ckpt-)", found.group(2)):
        reason = part.split(": ", 1)[1] if ": " in part else part
        by_reason[next((name for key, name in _REASONS if key in reason), "other")] += 1
    untried = re.search(r"(\d+) older checkpoint\(s\) not tried", line)
    assert sum(by_reason.values()) == total and "other" not in by_reason, (by_reason, line)
    return total, by_reason, int(untried.group(1)) if untried else 0


def _refused_cell(line: str) -> str:
    total, by_reason, untried = refusals(line)
    text = f"checkpoints refused: {total} ({_counts(by_reason)})"
    return text + (f", {untried} older not tried" if untried else "")


# --------------------------------------------------------------------------------------------
# Silent data changes
# --------------------------------------------------------------------------------------------


def _compressed_shards(work: Path, short: Short) -> list[list[Any]]:
    from zephon_testing.scenarios import shard_integrity as tsi

    data, gz = tsi.zst(), tsi.gz()
    frames = tsi.zst_frames(tsi.CONTENT, 4)
    last = len(tsi.zst(tsi.CONTENT[-(len(tsi.CONTENT) // 4) :]))
    cases = [
        ("`.jsonl.zst`, last byte removed", "jsonl.zst", data[:-1], "fail"),
        ("`.jsonl.zst`, last byte removed", "jsonl.zst", data[:-1], "skip"),
        ("`.jsonl.zst`, cut at half", "jsonl.zst", data[: len(data) // 2], "skip"),
        ("`.jsonl.zst` of 4 frames, the last cut", "jsonl.zst", frames[: -(last // 2)], "skip"),
        ("`.jsonl.zst` with trailing garbage", "jsonl.zst", data + b"not zstd", "skip"),
        ("`.jsonl.gz`, last byte removed", "jsonl.gz", gz[:-1], "skip"),
        ("`.jsonl.gz` without its 8-byte trailer", "jsonl.gz", gz[:-8], "skip"),
    ]
    rows = []
    for i, (name, ext, content, on_error) in enumerate(cases):
        path = tsi.write(_dir(work / f"shard-{i}"), f"web.{ext}", content)
        message = tsi.refused(path, on_error)
        rows.append([f"{name}, `on_error: {on_error}`", f"DataError: {short(message)}"])
    cli = tsi.run_truncated_shard_cli(_dir(work / "cli"))
    for command, res in cli["runs"].items():
        line = next(x for x in res.stderr.splitlines() if x.startswith("zephon: error:"))
        rows.append(
            [
                f"`zephon {command}` over it (`on_error: skip`)",
                f"exit {res.returncode}, one line, no traceback: {short(line, 140)}",
            ]
        )
    return rows


def _rewritten_shard(work: Path, short: Short) -> list[list[Any]]:
    from zephon_testing.scenarios import shard_identity_service as tsis

    changed = tsis.make_changed(_dir(work / "identity"))
    res = tsis.run_resume_latest_onto_changed(changed)
    line = next(x for x in res.stderr.splitlines() if x.startswith("zephon: error:"))
    detail = line[line.index(f"shard {changed.shard}") :]
    rows = [
        [
            "`--resume latest` after a same-size in-place rewrite of a shard",
            f"exit {res.returncode}; {_refused_cell(line)}: {short(detail, 200)}",
        ]
    ]
    for where, (code, details) in tsis.run_resume_rpc_onto_changed(changed).items():
        rows.append([f"Resume RPC onto the rewritten shard, {where}", f"{code}: {short(details)}"])
    f = tsis.run_rewrite_while_serving(_dir(work / "while-serving"))
    code, details = f["error"]
    rows.append(
        [
            "every shard rewritten in place while lane 0 streams",
            f"{f['served']} of the lane's {f['lane_batches']} batches served, each equal to "
            f"`zephon dump`'s, then {code}: {short(details, 160)}",
        ]
    )
    return rows


def _swapped_server(work: Path, corpus: Path, short: Short) -> list[list[Any]]:
    from zephon_testing.scenarios import client_identity as tci

    pipelines = tci.make_pipelines(_dir(work / "swap"), corpus)
    rows = []
    for verify in (False, True):
        f = tci.run_swap_to_another_pipeline(pipelines, verify)
        rows.append(
            [
                f"server restarted with another pipeline, client `verify={verify}`",
                f"PipelineMismatch after {f['yielded']} batches (all the first pipeline's), "
                f"{f['acked']} acknowledged to the new server: {short(f['error'], 170)}",
            ]
        )
    f = tci.run_swap_to_the_same_pipeline(pipelines)
    rows.append(
        [
            "server restarted with the same pipeline, `verify=False`",
            f"no error; {f['yielded']} batches, every lane to its end once and in order "
            f"({f['acked']} acknowledged to the new server)",
        ]
    )
    return rows


def silent_changes(rep: Report, work: Path, corpus: Path, short: Short) -> None:
    rows = _compressed_shards(_dir(work / "compressed"), short)
    rows += _rewritten_shard(work, short)
    rows += _swapped_server(work, corpus, short)
    rep.add(
        "### Silent data change refused",
        "",
        "Compressed shards of 8,192 rows of 128 bytes (the issue's reproduction) cut or "
        "damaged; a same-size in-place rewrite of a shard after a checkpoint and while "
        "serving; a server restarted on the trainer's address with another pipeline.",
        "",
    )
    rep.table(["case", "what happened"], rows)


# --------------------------------------------------------------------------------------------
# Checkpoints refused
# --------------------------------------------------------------------------------------------


def refused_checkpoints(rep: Report, work: Path, setup: dict[str, Any], short: Short) -> str:
    """Add the table; returns the start-up error line for a checkpoint that is a directory."""
    from zephon_testing.scenarios import startup as tst

    cfg, other, good = setup["cfg"], setup["other"], setup["good"]
    f = tst.run_every_checkpoint_refused(cfg, good, _dir(work / "all"))
    stop = tst.run_stop_at_another_pipeline(cfg, other, good, _dir(work / "other"))
    fresh = sorted(set(f["fresh"].values()))
    rows = [
        [
            "`--resume latest`, 4 damaged files (cut, a flipped bit, a zip, a directory)",
            f"{_refused_cell(f['latest'])}; {short(f['latest'], 180)}",
        ],
        [
            "`--resume latest`, ours < another pipeline's < a torn one (newest)",
            f"{_refused_cell(stop)}; {short(stop, 180)}",
        ],
        [
            "`--resume latest-or-fresh` over the 4 damaged files",
            f"started at seq {', '.join(map(str, fresh))} on {len(f['fresh'])} lanes, "
            f"SIGTERM exit {f['exit']}; logged: {short(f['warning'], 150)}",
        ],
    ]
    for case, outcome in tst.run_signed_checkpoints(cfg, good, _dir(work / "signed")).items():
        rows.append([f"signed checkpoints, {case}", short(outcome, 180)])
    rep.add(
        "### Checkpoints refused, and why",
        "",
        "`zephon serve --resume` over damaged checkpoint files, and HMAC-signed checkpoints "
        "(`--checkpoint-key-file`, `ZEPHON_CHECKPOINT_KEY`) against a forged one (payload "
        "edited, checksum recomputed), an unsigned one and another key's.",
        "",
    )
    rep.table(["case", "what happened"], rows)
    return f["named"]


# --------------------------------------------------------------------------------------------
# Bounds: requests, disk
# --------------------------------------------------------------------------------------------


def _requests(work: Path, corpus: Path, short: Short) -> list[list[Any]]:
    from zephon_testing.scenarios import request_limits as trl

    rows = []
    with trl.limited_server(_dir(work / "limits"), corpus) as limited:
        for name, call, text in trl.FIELD_CASES:
            code, details = trl.check_field_case(limited, name, call, text)
            rows.append([name, f"{code}: {short(details, 160)}"])
        for name, (code, details) in trl.run_receive_limit(limited).items():
            rows.append([name, f"{code}: {short(details, 160)}"])
    g = trl.run_undecodable_requests(_dir(work / "garbage"), corpus)
    rows.append(
        [
            f"{g['requests']} undecodable requests over every method",
            f"{_counts(g['codes'])}; log lines for {g['requests']} garbage requests: "
            f"{g['log_lines']}, tracebacks: {g['tracebacks']} ({g['elapsed_s']:.1f} s); "
            f"e.g. {short(g['line'], 130)}",
        ]
    )
    return rows


def _disk(work: Path, setup: dict[str, Any], short: Short) -> list[list[Any]]:
    from zephon_testing.scenarios import disk_full as tdf

    figures = tdf.run_fill_a_small_disk(setup["cfg"], setup["expected"], _dir(work / "disk"))
    size = tdf.DISK[:-1] + " " + {"k": "KiB", "m": "MiB"}[tdf.DISK[-1]]
    rows = []
    for cache, f in figures.items():
        code, details = f["full"]
        used = (
            f"; the replay cache took {f['cache_used'] / 1024:.0f} KiB of its "
            f"{f['cache_budget'] / 1024:.0f} KiB budget"
            if "cache_used" in f
            else ""
        )
        rows.append(
            [
                f"Checkpoint until a {size} tmpfs state disk is full, replay cache {cache}",
                f"{f['saved']} checkpoints saved, then {code}: {short(details, 110)}; "
                f"{f['free_bytes']} bytes left free{used}; every lane then read to its end "
                f"equal to `zephon dump`, health {f['health']}; {f['log_lines']} log "
                f"line(s), {f['tracebacks']} tracebacks",
            ]
        )
        if "read_only" in f:
            code, details = f["read_only"]
            rows.append(["Checkpoint on the disk remounted read-only", f"{code}: {short(details)}"])
    return rows


MEMORY_DOC_MB = 50  # the reproduction: 97,675 buffered batches and 1.9 GB RSS


def _memory(work: Path, corpus: Path) -> list[list[Any]]:
    from zephon_testing.scenarios import memory_bound as tm
    from zephon_testing.scenarios import replays as tr

    huge = tm.make_huge_config(_dir(work / "memory" / "huge"), MEMORY_DOC_MB)
    acked = tm.run_never_acking(huge, _dir(work / "memory" / "never-acks"))
    idle = tm.run_no_consumer(corpus, _dir(work / "memory" / "idle"))
    shared = tr.run_thirty_streams(tr.make_setup(_dir(work / "memory" / "replays"), corpus))
    bound = int(acked["bound"])
    return [
        [
            f"one {MEMORY_DOC_MB} MB document, `--max-ahead {tm.MAX_AHEAD}`, streams that "
            "never acknowledge",
            f"buffered batches per lane <= {acked['buffered']:.0f}, unacknowledged "
            f"<= {acked['lag']:.0f} (bound {bound}: --max-ahead + max(8, --max-ahead / 2)); "
            f"peak server RSS {acked['rss_mb']:.0f} MB",
        ],
        [
            f"no consumer at all on {idle['lanes']:.0f} lanes for 4 s",
            f"at most {idle['worst']:.0f} batches buffered on any lane (bound {bound})",
        ],
        [
            f"{shared['streams']} streams opened at evicted seqs of one lane and epoch",
            f"{shared['replays']} replay run started for all of them; server threads "
            f"{shared['threads_before']} -> {shared['threads_during']} (two per stream are "
            f"the streams' own), RSS {shared['rss_before_mb']} -> {shared['rss_during_mb']} "
            "MB; every stream equal to `zephon dump`",
        ],
    ]


def bounds(rep: Report, work: Path, corpus: Path, setup: dict[str, Any], short: Short) -> None:
    rows = _memory(work, corpus) + _requests(work, corpus, short) + _disk(work, setup, short)
    rep.add(
        "### Bounds: memory, request fields, message size, undecodable requests, a full disk",
        "",
        "A lane buffers at most `--max-ahead` + max(8, `--max-ahead` / 2) unacknowledged "
        "batches whatever the documents (the producer waits); replays of one lane and epoch "
        "share one regeneration. Each request over a bound is refused and nothing is stored; the "
        "server stays SERVING. The state directory on a real small tmpfs.",
        "",
    )
    rep.table(["case", "what happened"], rows)


# --------------------------------------------------------------------------------------------
# Crash loops and clean crashes
# --------------------------------------------------------------------------------------------


def _bad_records(work: Path, corpus: Path) -> list[list[Any]]:
    from zephon_testing.scenarios import bad_records as tbr

    f = tbr.run_bad_records_server(_dir(work / "records"), corpus)
    by_kind: dict[tuple[str, str], list[int]] = {}
    for row, (kind, reason) in f["skipped"].items():
        by_kind.setdefault((kind, reason), []).append(row)
    skipped = "; ".join(
        f"{kind} (row {', '.join(map(str, rows))}): {reason}"
        for (kind, reason), rows in sorted(by_kind.items(), key=lambda kv: kv[1])
    )
    return [
        [
            f"{f['records']} records under `on_error: skip`, bad ones among them",
            f"skipped and counted: {skipped}; every record closed exactly once "
            f"({f['closed']}); `zephon_records_skipped_total` {f['skipped_metric']:.0f}; "
            f"health {f['health']}; exit {f['exit']}, {f['tracebacks']} tracebacks",
        ]
    ]


def _start_up(work: Path, setup: dict[str, Any], short: Short) -> list[list[Any]]:
    from zephon_testing.scenarios import startup as tst

    lines = {"`--resume` naming a checkpoint that is a directory": setup["directory_line"]}
    tls = tst.run_tls_key_of_another_certificate(setup["cfg"], _dir(work / "tls"))
    lines["TLS key of another certificate"] = tls
    for case, line in tst.run_busy_port_or_unknown_host(setup["cfg"], _dir(work / "port")).items():
        lines[case] = line
    rows = [[case, short(line, 220)] for case, line in lines.items()]
    outcomes = tst.run_sigterm_during_start_up(setup["cfg"], setup["good"], _dir(work / "term"))
    rows.append(
        [
            "SIGTERM during start-up (`--runner processes`, resuming), after "
            + ", ".join(f"{delay:g}" for delay, _, _ in outcomes)
            + " s",
            "exit "
            + ", ".join(f"{code} ({how})" for _, code, how in outcomes)
            + "; no traceback, no process left",
        ]
    )
    return rows


def _kill_9(work: Path, corpus: Path) -> list[list[Any]]:
    from zephon_server.engine.shm_owner import BLOCK_PREFIX, OWNER_PREFIX
    from zephon_testing.scenarios import crash_cleanup as tcc
    from zephon_testing.servers import write_config

    cfg = write_config(_dir(work / "endless") / "pipeline.yaml", corpus, exhaustion="repeat")
    k = tcc.run_sigkill_of_the_server(cfg, _dir(work / "kill"))
    kinds = Counter(
        "semaphores"
        if n.startswith("sem.")
        else "payload blocks"
        if n.startswith(BLOCK_PREFIX)
        else "owner file"
        if n.startswith(OWNER_PREFIX)
        else "other"
        for n in k["entries"]
    )
    s = tcc.run_sweep_of_a_killed_tree(cfg, _dir(work / "sweep"))
    return [
        [
            "kill -9 of a `--runner processes --workers 2` server holding payload blocks",
            f"before: {k['workers']} workers + {k['trackers']} resource tracker, "
            f"{len(k['entries'])} /dev/shm entries ({_counts(kinds)}); processes left "
            f"{k['processes_left']} after {k['gone_s']:.1f} s, entries left "
            f"{len(k['left_after_kill'])} (the owner file); after the next start-up: orphans "
            f"left after kill -9: {k['processes_left']} processes, "
            f"{len(k['left_after_start'])} /dev/shm entries",
        ],
        [
            "the whole tree killed at once (tracker first) while another server runs, SIGSTOPped",
            f"{s['dead_processes']} dead processes left {len(s['dead_entries'])} /dev/shm "
            f"entries; after the next start-up {len(s['dead_left'])} of them remained, the live "
            f"server kept {len(s['live_kept'])} of its {len(s['live_entries'])} and then "
            f"served {s['live_batches_checked']} batches equal to `zephon dump`'s",
        ],
    ]


def crash_loops(rep: Report, work: Path, corpus: Path, setup: dict[str, Any], short: Short) -> None:
    rows = _bad_records(work, corpus) + _start_up(work, setup, short) + _kill_9(work, corpus)
    rep.add(
        "### Crash loops and clean crashes",
        "",
        "A real server over bad records; start-up problems that used to be tracebacks; "
        "SIGTERM at moments of the start-up; kill -9 of a processes-runner server (real "
        "signals, the real `/dev/shm`).",
        "",
    )
    rep.table(["case", "what happened"], rows)


# --------------------------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------------------------


def metrics_endpoint(rep: Report, work: Path, short: Short) -> None:
    from zephon_testing.scenarios import metrics_http as tmh
    from zephon_testing.scenarios import security as ts

    rows: list[list[Any]] = []
    for case, outcome in tmh.run_metrics_on_loopback_by_default(_dir(work / "bind")).items():
        rows.append([f"`--host 0.0.0.0`, no `--metrics-host`: {case}", outcome])
    for case, outcome in tmh.run_metrics_on_all_interfaces(_dir(work / "wide")).items():
        rows.append([f"`--metrics-host 0.0.0.0`, gRPC with a token: {case}", short(outcome)])
    auth = tmh.run_metrics_auth(_dir(work / "auth"))
    rows.append(
        [
            "bearer token and basic auth",
            f"{len(auth['refused'])} wrong or missing credentials: "
            f"{_counts(Counter(map(str, auth['refused'])))}; {len(auth['accepted'])} right "
            f"ones: {_counts(Counter(map(str, auth['accepted'])))}",
        ]
    )
    pki = ts.make_pki(work / "pki")
    for mutual in (False, True):
        setup = "mutual TLS" if mutual else "TLS"
        for case, outcome in tmh.run_metrics_tls(_dir(work / setup), pki, mutual).items():
            rows.append([f"{setup} with the gRPC certificate: {case}", outcome])
    rep.add("### /metrics: bind address, authentication, TLS", "")
    rep.table(["case", "outcome"], rows)


# --------------------------------------------------------------------------------------------


def hardening(rep: Report, work: Path, corpus: Path) -> None:
    """Run every hardening scenario under ``work`` over ``corpus``; add the section."""
    from zephon_testing.scenarios import startup as tst
    from zephon_testing.servers import dump_digests, write_config

    work = _dir(work / "hardening")
    short = Short(work)
    cfg = write_config(work / "pipeline.yaml", corpus)
    setup = {
        "cfg": cfg,
        "other": write_config(work / "other.yaml", corpus, seed=999),
        "good": tst.state_of(cfg),
        "expected": dump_digests(cfg, 100_000),
    }
    rep.add(
        "## Hardening: silent changes, bounds, crash loops",
        "",
        "The cases of issue 19, each run as its test runs it (real servers, files, "
        "filesystems and signals); messages shortened to their first part, `<work>` the "
        "run's temporary directory.",
        "",
    )
    silent_changes(rep, work / "silent", corpus, short)
    setup["directory_line"] = refused_checkpoints(rep, work / "refused", setup, short)
    bounds(rep, work / "bounds", corpus, setup, short)
    crash_loops(rep, work / "crash", corpus, setup, short)
    metrics_endpoint(rep, work / "metrics", short)
