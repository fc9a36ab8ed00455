"""``tools/reliability_report.py`` renders the scenarios' figures into ``docs/reliability.md``.

The scenario functions start real servers (``tests/reliability``); here they are replaced by
fakes returning fixed figures, so the sections' text, their tables and the checks that abort
a run with wrong figures are pinned without a socket.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import reliability_report as rr

from zephon_testing import servers
from zephon_testing.scenarios import bad_input as tb
from zephon_testing.scenarios import faults as tf
from zephon_testing.scenarios import load as tl

EXACT = dict.fromkeys(
    ("lost", "duplicated", "unexpected", "chain_mismatches", "docs_lost", "docs_duplicated"), 0
)


class Fakes:
    """The scenario functions ``faults``, ``load`` and ``bad_input`` call, with the calls made."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.ref = SimpleNamespace(
            chains={0: ["a"] * 20, 1: ["b"] * 20},
            batches=40,
            documents=set(range(120)),
            check_covers_corpus=lambda: self.calls.append(("covers",)),
        )
        self.kill_figures: dict[str, Any] = {}
        self.worker_health = ("NOT_SERVING", "SERVING")
        self.drain_exit = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for module, names in (
            (tf, ("exact_config", "reference_run", "kill_writer", "run_drain_scenario")),
            (tf, ("run_kill_scenario", "run_network_scenario", "run_worker_kill_scenario")),
            (tl, ("run_streams_load", "run_slow_consumer", "run_cancel_scenario")),
            (tl, ("run_stream_limit",)),
            (tb, ("running_servers", "check_case", "run_fuzz", "check_corruptions")),
            (tb, ("run_malformed_data",)),
        ):
            for name in names:
                monkeypatch.setattr(module, name, getattr(self, name))
        monkeypatch.setattr(servers, "dump_digests", self.dump_digests)
        monkeypatch.setattr(tb, "CASES", self.cases())

    # faults
    def exact_config(self, path: Path, corpus: Path) -> Path:
        self.calls.append(("exact_config", path.name))
        return path

    def reference_run(self, cfg: Path) -> Any:
        return self.ref

    def dump_digests(self, cfg: Path, limit: int) -> dict[int, list[str]]:
        self.calls.append(("dump", limit))
        return self.ref.chains

    def run_kill_scenario(self, cfg: Path, ref: Any, work: Path, points: list) -> dict[str, Any]:
        self.calls.append(("kill", work.name, [tuple(vars(p).values()) for p in points]))
        n = len(points)
        figures: dict[str, Any] = {**EXACT, "kills": n, "batches": 40 + n}
        figures.update(restart_s=[0.5 + n / 10], recovery_s=[1.0 + n / 10, 2.0])
        figures.update(self.kill_figures)
        return figures

    def kill_writer(self, work: Path, mode: str, delay: float, stage: str = "-") -> dict:
        self.calls.append(("writer", mode, delay, stage))
        latest = "new-and-longer" if stage == "dir-fsync" or delay > 0.15 else "old"
        return {"latest": latest, "stray_temp_files": 0, "checkpoints": 1}

    def run_network_scenario(self, cfg: Path, ref: Any, work: Path, fault: str) -> dict:
        self.calls.append(("network", work.name, fault))
        holed = fault.startswith("blackhole")
        return {
            **EXACT,
            "batches": 40,
            "connections": 2 if holed else 1,
            "resets": 3 if fault == "reset" else 0,
            "detect_s": [2.04, 9.0] if holed else [],
            "elapsed_s": 12.345,
        }

    def run_worker_kill_scenario(self, cfg: Path, ref: Any, work: Path, recovery: str) -> dict:
        self.calls.append(("worker", work.name, recovery))
        after, recovered = self.worker_health
        return {
            **EXACT,
            "batches": 44,
            "fail_s": 0.123,
            "status": "INTERNAL",
            "message": "pipeline failed: worker process died; pid 7 exit code -9",
            "health_after": after,
            "health_recovered": recovered,
            "recover_s": 3.456 if recovery == "restart" else 0.789,
        }

    def run_drain_scenario(self, cfg: Path, work: Path, grace: float) -> dict[str, Any]:
        self.calls.append(("drain", work.name, grace))
        streams = {lane: ("UNAVAILABLE", "draining", 0.5 + lane, 3) for lane in range(4)}
        streams[4] = ("OK", "end of lane", 0.25, 9)
        figures = {"exit_code": self.drain_exit, "exit_s": 4.321, "not_serving_s": 0.0123}
        return {**figures, "streams": streams}

    # load
    def run_streams_load(self, corpus: Path, work: Path, streams: int, hold_s: float) -> dict:
        self.calls.append(("streams", work.name, streams, hold_s))
        return {
            "streams": streams,
            "hold_s": hold_s,
            "errors": [],
            "ended": 0,
            "batches": 12345,
            "batches_per_s": 617.25,
            "min_batches_per_stream": 99,
            "wait_p50_ms": 1.234,
            "wait_p99_ms": 56.7,
            "rss_mb": (100.04, 101.26),
            "rss_growth_mb": 1.22,
            "threads": (40, 42),
            "fds": (70, 71),
            "health": "SERVING",
        }

    def run_slow_consumer(self, corpus: Path, work: Path) -> dict[str, Any]:
        self.calls.append(("slow", work.name))
        rates = {"baseline_rates": [90.0, 80.4, 81.6, 79.5], "fast_ratio": 1.0679}
        return {**rates, "mixed_rates": [5.0, 85.2, 86.0, 84.9]}

    def run_cancel_scenario(self, corpus: Path, work: Path) -> dict[str, Any]:
        self.calls.append(("cancel", work.name))
        return {"freed": True, "freed_s": 0.0456}

    def run_stream_limit(self, corpus: Path, work: Path) -> dict[str, Any]:
        self.calls.append(("limit", work.name))
        return {"extra": ("RESOURCE_EXHAUSTED", "too many streams"), "health": "SERVING"}

    # bad input
    @staticmethod
    def cases() -> list[tuple[str, Any, grpc.StatusCode, str]]:
        codes = [grpc.StatusCode.INVALID_ARGUMENT] * 3 + [grpc.StatusCode.NOT_FOUND]
        return [(f"case{i}", None, code, "text") for i, code in enumerate(codes)]

    @contextlib.contextmanager
    def running_servers(self, work: Path, corpus: Path) -> Any:
        self.calls.append(("running", work.name))
        yield SimpleNamespace(state=b"state")

    def check_case(self, running: Any, name: str, call: Any, code: Any, text: str) -> str:
        self.calls.append(("case", name))
        return ""

    def run_fuzz(self, running: Any, examples: int) -> dict[str, Any]:
        self.calls.append(("fuzz", examples))
        codes = {("stream", "INVALID_ARGUMENT"): 5, ("raw", "INTERNAL"): 2}
        return {"requests": examples, "codes": {**codes, ("resume", "INVALID_ARGUMENT"): 4}}

    def check_corruptions(self, state: bytes) -> dict[str, Any]:
        return {"cases": 321, "by_status": {"INVALID_ARGUMENT": 300, "FAILED_PRECONDITION": 21}}

    def run_malformed_data(
        self, corpus: Path, work: Path, on_error: str, damage: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        self.calls.append(("malformed", work.name, on_error, damage))
        if on_error == "fail":
            return {"error": ("DATA_LOSS", f"failed on {damage or 'bad lines'}")}
        ends = {0: SimpleNamespace(closed=[1, 2]), 1: SimpleNamespace(closed=[3])}
        metrics = {"skipped": 7.0, "malformed": 5.0, "read_error": 2.0}
        return {"closed": list(range(130)), "ends": ends, "metrics": metrics}


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Fakes:
    found = Fakes()
    found.install(monkeypatch)
    return found


def rendered(section, *args: Any) -> list[str]:
    rep = rr.Report()
    section(rep, *args)
    return rep.lines


def table_after(lines: list[str], heading: str) -> list[str]:
    """The Markdown table rows (header and separator included) of the section ``heading``."""
    start = lines.index(heading)
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    end = lines.index("", first)
    return lines[first:end]


def test_faults_section_headings_and_tables(fakes: Fakes, tmp_path: Path) -> None:
    lines = rendered(rr.faults, tmp_path, tmp_path / "corpus", False, 20240601)
    headings = [line for line in lines if line.startswith("#")]
    assert headings == [
        "## Faults",
        "### SIGKILL of the server, restart with `--resume latest`",
        "### SIGKILL during a checkpoint write",
        "### Network faults (TCP fault proxy on 127.0.0.1)",
        "### A killed worker process (`--runner processes`)",
        "### SIGTERM drain (`--drain-grace 5`)",
    ]
    assert fakes.calls[:3] == [("exact_config", "pipeline.yaml"), ("covers",), ("dump", 100_000)]
    kills = [c for c in fakes.calls if c[0] == "kill"]
    assert [c[1] for c in kills] == [f"kill{i}" for i in range(6)]
    points = [p for c in kills for p in c[2]]
    assert all(1 <= at < 40 and 0 <= delay <= 40 for at, delay, _ in points)
    during = sum(d for _, _, d in points)
    intro = next(line for line in lines if line.startswith("One `DataClient` reads all"))
    assert intro.startswith(
        "One `DataClient` reads all 2 lanes of a finite corpus (40 batches, 120 documents) and "
        "asks for a server checkpoint every 6 batches"
    )
    table = table_after(lines, "### SIGKILL of the server, restart with `--resume latest`")
    restarts = sorted(0.5 + len(c[2]) / 10 for c in kills)
    assert table == [
        "| figure | value |",
        "|---|---|",
        "| runs | 6 |",
        f"| kill points survived | {len(points)} ({during} during a Checkpoint RPC) |",
        f"| batches checked | {6 * 40 + len(points)} |",
        "| batches lost / duplicated | 0 / 0 |",
        "| documents lost / duplicated | 0 / 0 |",
        "| chain digest mismatches | 0 |",
        f"| kill → restarted server listening | {rr._fmt_s(restarts)} |",
        "| kill → first batch from the new server (recovery) | "
        + rr._fmt_s([r for c in kills for r in (1.0 + len(c[2]) / 10, 2.0)])
        + " |",
    ]


def test_faults_section_checkpoint_writes_network_worker_and_drain(fakes, tmp_path) -> None:
    lines = rendered(rr.faults, tmp_path, tmp_path / "corpus", False, 7)
    writers = [c for c in fakes.calls if c[0] == "writer"]
    stages = ["data-fsync", "rename", "dir-fsync"] + ["-"] * 6
    expected = [(mode, stage) for mode in ("overwrite", "save") for stage in stages]
    assert [(m, s) for _, m, _, s in writers] == expected
    assert all(d == 0.0 for _, _, d, s in writers if s != "-")
    table = table_after(lines, "### SIGKILL during a checkpoint write")
    assert table[0] == "| mode | kill point | newest checkpoint afterwards | runs |"
    rows = [row.strip("| ").split(" | ") for row in table[2:]]
    assert rows == sorted(rows) and sum(int(r[3]) for r in rows) == 18
    assert ["overwrite", "at dir-fsync", "new-and-longer", "1"] in rows
    assert ["save", "at rename", "old", "1"] in rows

    assert table_after(lines, "### Network faults (TCP fault proxy on 127.0.0.1)") == [
        "| fault | batches | lost / duplicated | TCP connections | resets | dead peer found "
        "| elapsed |",
        "|---|---|---|---|---|---|---|",
        "| latency | 40 | 0 / 0 | 1 | 0 | - | 12.3 s |",
        "| bandwidth | 40 | 0 / 0 | 1 | 0 | - | 12.3 s |",
        "| reset | 40 | 0 / 0 | 1 | 3 | - | 12.3 s |",
        "| blackhole | 40 | 0 / 0 | 2 | 0 | 2.0 s | 12.3 s |",
        "| blackhole-default-keepalive | 40 | 0 / 0 | 2 | 0 | 2.0 s | 12.3 s |",
    ]
    assert ("network", "net-reset", "reset") in fakes.calls
    assert table_after(lines, "### A killed worker process (`--runner processes`)") == [
        "| recovery | kill → stream error | status and message | health | recovery "
        "| lost / duplicated |",
        "|---|---|---|---|---|---|",
        "| restart | 0.12 s | INTERNAL: pipeline failed: worker process died | NOT_SERVING "
        "| 3.46 s | 0 / 0 |",
        "| resume | 0.12 s | INTERNAL: pipeline failed: worker process died | NOT_SERVING "
        "| 0.79 s | 0 / 0 |",
    ]
    assert [c for c in fakes.calls if c[0] == "worker"] == [
        ("worker", "worker-restart", "restart"),
        ("worker", "worker-resume", "resume"),
    ]
    assert lines[-11:] == [
        "### SIGTERM drain (`--drain-grace 5`)",
        "",
        "Four lanes mid-stream and a health `Watch`:",
        "",
        "| figure | value |",
        "|---|---|",
        "| SIGTERM → health NOT_SERVING | 12 ms |",
        "| stream endings | OK (end of lane), UNAVAILABLE (draining) |",
        "| SIGTERM → last stream ended (client side) | 3.50 s |",
        "| SIGTERM → process exit | 4.32 s, exit code 0 |",
        "",
    ]
    assert ("drain", "drain", 5.0) in fakes.calls


def test_faults_long_tier_runs_more(fakes: Fakes, tmp_path: Path) -> None:
    lines = rendered(rr.faults, tmp_path, tmp_path / "corpus", True, 3)
    kills = [c for c in fakes.calls if c[0] == "kill"]
    assert len(kills) == 25 and all(1 <= len(c[2]) <= 5 for c in kills)
    assert max(len(c[2]) for c in kills) > 3  # up to 5 kill points a run in the long tier
    assert sum(c[0] == "writer" and c[3] == "-" for c in fakes.calls) == 24
    assert "| runs | 25 |" in lines


def test_faults_seed_decides_the_kill_points(fakes: Fakes, tmp_path: Path) -> None:
    rendered(rr.faults, tmp_path, tmp_path, False, 11)
    first, fakes.calls = fakes.calls, []
    rendered(rr.faults, tmp_path, tmp_path, False, 11)
    assert fakes.calls == first
    rendered(rr.faults, tmp_path, tmp_path, False, 12)
    assert fakes.calls != first


@pytest.mark.parametrize(
    "broken",
    [
        lambda f: f.kill_figures.update(lost=1),
        lambda f: f.kill_figures.update(docs_duplicated=2),
        lambda f: setattr(f, "worker_health", ("SERVING", "SERVING")),
        lambda f: setattr(f, "worker_health", ("NOT_SERVING", "NOT_SERVING")),
        lambda f: setattr(f, "drain_exit", 1),
    ],
)
def test_a_failed_check_aborts_the_faults_section(fakes: Fakes, tmp_path: Path, broken) -> None:
    broken(fakes)
    with pytest.raises(AssertionError):
        rendered(rr.faults, tmp_path, tmp_path, False, 1)


def test_a_reference_unlike_zephon_dump_aborts(fakes: Fakes, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(servers, "dump_digests", lambda cfg, limit: {0: ["x"]})
    with pytest.raises(AssertionError, match="reference differs from zephon dump"):
        rendered(rr.faults, tmp_path, tmp_path, False, 1)
    assert not any(c[0] == "kill" for c in fakes.calls)


def test_load_section(fakes: Fakes, tmp_path: Path) -> None:
    lines = rendered(rr.load, tmp_path, tmp_path / "corpus", False)
    assert [c[:2] for c in fakes.calls] == [
        ("streams", "load"),
        ("slow", "slow"),
        ("cancel", "cancel"),
        ("limit", "limit"),
    ]
    assert fakes.calls[0][2:] == (64, 20.0)
    assert lines[:3] == ["## Load", "", "### 64 concurrent lane streams for 20 s"]
    assert table_after(lines, "### 64 concurrent lane streams for 20 s") == [
        "| figure | value |",
        "|---|---|",
        "| streams held / errors / ended early | 64 / 0 / 0 |",
        "| batches received | 12345 (617/s, at least 99 per stream) |",
        "| next-batch wait p50 / p99 | 1.2 ms / 57 ms |",
        "| RSS after warm-up (first half → second half median) | 100.0 → 101.3 MB (+1.2 MB) |",
        "| threads after warm-up (min-max) | 40-42 |",
        "| file descriptors after warm-up (min-max) | 70-71 |",
        "| health at the end | SERVING |",
    ]
    assert table_after(lines, "### Slow consumer, cancellation, stream limit") == [
        "| figure | value |",
        "|---|---|",
        "| fast lanes, batches/s alone | 80, 82, 80 |",
        "| fast lanes, batches/s next to a slow one (5/s) | 85, 86, 85 (ratio 1.07) |",
        "| cancelled stream blocked in the hub: streams, consumers, threads freed after | 46 ms |",
        "| stream beyond `--max-streams 3` | RESOURCE_EXHAUSTED: too many streams |",
        "| health / GetInfo while at the limit | SERVING / answered |",
    ]
    assert lines[-1] == ""
    fakes.calls = []
    assert "### 64 concurrent lane streams for 120 s" in rendered(rr.load, tmp_path, tmp_path, True)
    assert fakes.calls[0][2:] == (64, 120.0)


def test_load_section_aborts_on_stream_errors(fakes: Fakes, tmp_path, monkeypatch) -> None:
    broken = {**fakes.run_streams_load(tmp_path, tmp_path, 64, 1.0), "ended": 1}
    monkeypatch.setattr(tl, "run_streams_load", lambda *a, **k: broken)
    with pytest.raises(AssertionError):
        rendered(rr.load, tmp_path, tmp_path, False)
    assert not any(c[0] == "slow" for c in fakes.calls)


def test_bad_input_section(fakes: Fakes, tmp_path: Path) -> None:
    lines = rendered(rr.bad_input, tmp_path, tmp_path / "corpus", False)
    assert fakes.calls[0] == ("running", "bad")
    assert [c[1] for c in fakes.calls if c[0] == "case"] == ["case0", "case1", "case2", "case3"]
    assert ("fuzz", 150) in fakes.calls
    assert [c[2:] for c in fakes.calls if c[0] == "malformed"] == [
        ("skip", ()),
        ("fail", ()),
        ("fail", ("vanish",)),
        ("fail", ("unreadable",)),
    ]
    assert lines[:3] == ["## Bad input", "", lines[2]]
    assert lines[2].startswith(
        "* **Status table**: 4 error cases over every RPC (INVALID_ARGUMENT 3, NOT_FOUND 1); "
    )
    assert lines[3].startswith(
        "* **Random requests** (hypothesis): 150 random or malformed StreamBatches / "
    )
    assert "outcomes INTERNAL 2, INVALID_ARGUMENT 9 (INTERNAL only for" in lines[3]
    assert lines[4].startswith("* **Corrupt checkpoints**: 321 cases (every truncation")
    assert "rejected: FAILED_PRECONDITION 21, INVALID_ARGUMENT 300, each message" in lines[4]
    table = table_after(lines, "### Malformed data end to end")
    assert table[:2] == ["| policy | outcome |", "|---|---|"]
    assert table[2].startswith(
        "| `on_error: skip` | 130 documents closed on the wire, none twice (3 of them dropped "
    )
    assert table[2].endswith(
        '`zephon_records_skipped_total{dataset="bad"}` 7 (malformed 5, read_error 2) |'
    )
    assert table[3:] == [
        "| `on_error: fail`, bad lines | DATA_LOSS: failed on bad lines |",
        "| `on_error: fail`, vanish | DATA_LOSS: failed on ('vanish',) |",
        "| `on_error: fail`, unreadable | DATA_LOSS: failed on ('unreadable',) |",
    ]
    assert lines[-1] == ""
    fakes.calls = []
    rendered(rr.bad_input, tmp_path, tmp_path, True)
    assert ("fuzz", 400) in fakes.calls
