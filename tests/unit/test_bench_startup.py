"""The start-up benchmark's pure parts (bench/startup_report.py): what the installed command
offers, medians and allocator ratios over rounds, the targets and the tables. No timings."""

from __future__ import annotations

import pytest

from bench import startup_report as sr
from bench.startup import Case, serve_args, server_env

pytestmark = pytest.mark.timeout(30)
MB = sr.MB


def run(case, alloc, rnd, ttfb, *, index="n/a", shards=100, serving=None, rss=60 * MB):
    return {
        "case": case,
        "shards": shards,
        "index": index,
        "allocator": alloc,
        "round": rnd,
        "to_serving": ttfb - 0.5 if serving is None else serving,
        "to_first_batch": ttfb,
        "rss_serving": rss,
        "ran_on": "mimalloc" if alloc == "default" else "glibc",
    }


def test_the_index_flag_is_read_from_the_serve_help():
    assert sr.supports_index_dir("  --index-dir DIR  where the shard index lives\n")
    assert sr.supports_index_dir("usage: zephon serve [--index-dir INDEX_DIR] [--gc]")
    assert not sr.supports_index_dir("  --index-directory X\n  --state-dir STATE_DIR\n")


def test_the_allocator_a_server_ran_on_comes_from_its_log_line():
    log = (
        "2026 INFO zephon_server.allocator: memory allocator: mimalloc (/usr/lib/libmimalloc.so.2)"
    )
    assert sr.allocator_from_log(f"x\n{log}\n") == "mimalloc"
    assert sr.allocator_from_log("... memory allocator: glibc malloc\n") == "glibc"
    glibc = "memory allocator: glibc malloc; install mimalloc (Debian/Ubuntu: apt-get ...)"
    assert sr.allocator_from_log(glibc) == "glibc"
    assert sr.allocator_from_log("no such line") == "?"


def test_rows_are_medians_over_rounds_and_keep_each_rounds_time():
    runs = [run("100 shards", "default", r, t) for r, t in enumerate([1.0, 3.0, 2.0])]
    runs += [run("100 shards", "system", r, 2.5) for r in range(3)]
    rows = sr.summarize(runs)
    assert [(r["case"], r["allocator"]) for r in rows] == [
        ("100 shards", "default"),
        ("100 shards", "system"),
    ]
    assert rows[0]["to_first_batch"] == 2.0 and rows[0]["rounds"] == [1.0, 3.0, 2.0]
    assert rows[0]["ran_on"] == ["mimalloc"] and rows[1]["ran_on"] == ["glibc"]


def test_the_allocator_ratio_is_the_median_of_per_round_ratios():
    # Round 1 ran on a slow machine for both: best/best would say 0.5 / 2.0.
    runs = [
        run("x", "default", 0, 1.0),
        run("x", "system", 0, 1.0),
        run("x", "default", 1, 4.0),
        run("x", "system", 1, 2.0),
        run("x", "default", 2, 0.9),
        run("x", "system", 2, 1.0),
        run("x", "default", 3, 1.0),  # its system start is missing: left out
    ]
    (ratio,) = sr.allocator_ratios(runs, "to_first_batch")
    assert ratio["rounds"] == [1.0, 2.0, 0.9]
    assert ratio["value"] == 1.0


def section(index_dir: bool, big_ttfb: float, big_rss: int, ref_ttfb: float) -> dict:
    index = "warm" if index_dir else "n/a"
    runs = []
    for alloc in sr.ALLOCATORS:
        runs.append(run("100 shards", alloc, 0, 1.0, index=index, rss=60 * MB))
        runs.append(
            run("10,000 shards", alloc, 0, big_ttfb, index=index, shards=10_000, rss=big_rss)
        )
        runs.append(run("ref", alloc, 0, ref_ttfb, index=index, shards=8, rss=big_rss))
        if index_dir:  # cold starts never judge the warm targets
            runs.append(run("10,000 shards", alloc, 0, 99.0, index="cold", shards=10_000))
    return {
        "index_dir": index_dir,
        "reference_case": "ref",
        "runs": runs,
        "index_rate": {
            "how": "`zephon index --workers 1`",
            "files": 8,
            "bytes": 304e6,
            "disk_rate": 500e6,
            "index_rate": 450e6,
            "note": "",
            "fadvise": {"cold_rate": 300e6, "warm_rate": 3000e6},
        },
    }


def test_targets_use_the_warm_default_allocator_rows():
    found = {t["label"]: t for t in sr.targets(section(True, 2.5, 150 * MB, 1.2))}
    warm = found["warm index, 10,000 shards: launch to first batch"]
    assert (warm["shown"], warm["ok"], warm["verdict"]) == ("2.50 s", True, "meets")
    rss = found["RSS at SERVING, 10,000 shards vs 100 shards"]
    assert rss["shown"] == "+90 MB (60 → 150 MB)" and rss["ok"]
    ref = found["reference workload (ref), warm index: launch to first batch"]
    assert ref["shown"] == "1.20 s" and ref["ok"]
    (rate,) = (t for t in found.values() if "read rate" in t["label"])
    assert rate["shown"] == "0.90 (450 vs 500 MB/s)" and rate["ok"]
    allocs = [t for t in found.values() if t["label"].startswith("default allocator")]
    assert len(allocs) == 2 and all(t["ok"] for t in allocs)  # equal times: ratio 1.00


def test_the_reference_with_end_of_data_longest_is_a_row_of_its_own_not_a_shard_count():
    data = section(True, 2.5, 150 * MB, 3.1)
    for alloc in sr.ALLOCATORS:  # 8 shards, fewer than any count case: never the "small" one
        data["runs"].append(run("ref, longest", alloc, 0, 1.3, index="warm", shards=8, rss=MB))
    data["reference_longest_case"] = "ref, longest"
    found = {t["label"]: t for t in sr.targets(data)}
    default = found["reference workload (ref), warm index: launch to first batch"]
    longest = found["reference workload (ref, longest), warm index: launch to first batch"]
    assert (default["shown"], default["ok"]) == ("3.10 s", False)
    assert (longest["shown"], longest["ok"]) == ("1.30 s", True)
    rss = found["RSS at SERVING, 10,000 shards vs 100 shards"]
    assert rss["shown"] == "+90 MB (60 → 150 MB)"


def test_missed_targets_say_by_how_much_and_no_warm_figure_is_claimed_without_the_index():
    found = sr.targets(section(False, 6.0, 200 * MB, 3.0))
    labels = [t["label"] for t in found]
    assert all("index: not available" in label for label in labels[:3])
    assert [t["verdict"] for t in found[:3]] == [
        "**misses: 2.0x the limit**",
        "**misses: 40 MB over**",
        "**misses: 2.0x the limit**",
    ]


def test_a_slower_default_allocator_misses_on_the_worst_path():
    runs = [run("100 shards", "default", 0, 1.2), run("100 shards", "system", 0, 1.0)]
    runs += [run("1,000 shards", "default", 0, 1.0), run("1,000 shards", "system", 0, 2.0)]
    found = sr.targets({"runs": runs})
    (ttfb, serving) = (t for t in found if t["label"].startswith("default allocator"))
    assert not ttfb["ok"] and ttfb["verdict"] == "**misses: 1.20 on 100 shards**"
    assert ttfb["shown"].startswith("worst 1.20 (100 shards, n/a index)")
    assert "1,000 shards n/a: 0.50" in ttfb["shown"]
    assert ttfb["shown"].endswith("pooled: 0.77 (geometric mean)")  # sqrt(1.2 x 0.5)
    assert "to SERVING" in serving["label"]


def test_tables_render_every_row_and_the_section_only_when_measured():
    sec = section(False, 2.0, 70 * MB, 1.0)
    table = sr.runs_table(sec)
    assert (
        "| 10,000 shards | not available | default (auto): mimalloc | 1.50 s | 2.00 s | 70 MB |"
        in (table)
    )
    assert "| 100 shards | not available | `--allocator system`: glibc |" in table
    text = "\n".join(sr.markdown({**sec, "method": ["How."], "storage": "S3: later."}))
    assert text.startswith("## Start-up\n\nHow.")
    assert "Dropping works here" in text and "S3: later." in text
    assert sr.markdown(None) == []


def test_the_servers_choose_their_own_allocator(monkeypatch, tmp_path):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libmimalloc.so.2")
    monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "-1")
    env = server_env()
    assert "LD_PRELOAD" not in env and "MIMALLOC_PURGE_DELAY" not in env
    case = Case("c", tmp_path / "p.yaml", ())
    args = serve_args(case, tmp_path, "default", None)
    assert args[args.index("--allocator") + 1] == "auto" and "--index-dir" not in args
    args = serve_args(case, tmp_path, "system", tmp_path / "idx")
    assert args[args.index("--allocator") + 1] == "system"
    assert args[args.index("--index-dir") + 1] == str(tmp_path / "idx")


@pytest.mark.parametrize("index_cmd", [False, True])
def test_with_the_index_each_case_starts_cold_then_warm_on_a_filled_directory(
    monkeypatch, tmp_path, index_cmd
):
    from bench import startup

    starts, builds = [], []

    def measure(case, run_dir, alloc, index_dir):
        starts.append((run_dir.name, alloc, index_dir and index_dir.name))
        return {"case": case.name, "allocator": alloc}

    monkeypatch.setattr(startup, "measure_start", measure)
    monkeypatch.setattr(startup, "build_index", lambda c, d, w, r: builds.append((d.name, w)))
    case = Case("c", tmp_path / "p.yaml", ())
    support = startup.Support(index_dir=True, index_cmd=index_cmd)
    runs = startup.run_case(case, support, 1, ("system", "default"), tmp_path)
    warm = "index-warm" if index_cmd else "index-cold-system"  # filled by the command or a start
    assert starts == [
        ("cold-system", "system", "index-cold-system"),
        ("cold-default", "default", "index-cold-default"),
        ("warm-system", "system", warm),
        ("warm-default", "default", warm),
    ]
    assert builds == ([("index-warm", 2)] if index_cmd else [])
    assert [r["index"] for r in runs] == ["cold", "cold", "warm", "warm"]
    assert {r["round"] for r in runs} == {1}
    # without --index-dir: one start per allocator, no index directory, no warm claim
    starts.clear()
    runs = startup.run_case(case, startup.Support(False, False), 0, sr.ALLOCATORS, tmp_path)
    assert starts == [("default", "default", None), ("system", "system", None)]
    assert [r["index"] for r in runs] == [sr.NOT_AVAILABLE] * 2


def test_the_server_cpu_to_serving_is_a_column_when_measured():
    runs = [
        {**run("100 shards", "default", r, 1.0), "cpu_serving": c} for r, c in enumerate([1, 3, 2])
    ]
    assert sr.runs_table({"runs": runs}).endswith("| 60 MB | 2.00 s |")
    unmeasured = [run("100 shards", "system", 0, 1.0)]  # results from before the column
    assert sr.runs_table({"runs": unmeasured}).endswith("| 60 MB |  |")


def test_the_storage_ratio_is_the_median_of_per_round_ratios() -> None:
    from bench import storage_rate

    section = {
        "corpus": "8 JSONL shards, 304 MB",
        "seconds": 20.0,
        "local": [100.0, 200.0, 0.0],
        "s3": [99.0, 178.0, 50.0],
        "ratios": storage_rate.ratio_rounds([100.0, 200.0, 0.0], [99.0, 178.0, 50.0]),
    }
    assert section["ratios"] == [0.99, 0.89, None]
    text = storage_rate.summary(section)
    assert "**0.94x**" in text and "missed" in text  # median of 0.99 and 0.89
    section["s3"], section["ratios"] = [99.0, 199.0], [0.99, 0.995]
    assert "met" in storage_rate.summary(section)


def test_the_index_rate_is_read_from_zephon_index_s_summary_line() -> None:
    from bench.startup import reported_rate

    line = (
        "indexed 8 shards of 1 dataset(s) in /tmp/i: 8 built, 0 already indexed; 61000 rows, "
        "304.0 MB (304.0 MB read) in 0.42 s (716.3 MB/s)"
    )
    assert reported_rate(line) == 716.3e6
    assert reported_rate("indexed 0 shards ... (12 B/s)") == 12.0
    assert reported_rate("no rate here") is None


def test_publishing_start_up_alone_replaces_only_its_section() -> None:
    from bench import startup_report

    page = (
        "# Benchmarks\n\n## Targets\n\n| old |\n\n## Start-up\n\nold start-up\n\n"
        "## Other figures\n\nkept\n"
    )
    section = {"method": ["how"], "runs": [], "storage": "S3 line"}
    out = startup_report.replace_section(page, section, "from its own run")
    assert "| old |" in out and "kept" in out and "old start-up" not in out
    assert out.index("## Start-up") < out.index("from its own run") < out.index("S3 line")
    assert out.index("S3 line") < out.index("## Other figures")
    # A page without the section gets it before "Other figures".
    bare = page.replace("## Start-up\n\nold start-up\n\n", "")
    out = startup_report.replace_section(bare, section, "from its own run")
    assert out.index("## Targets") < out.index("## Start-up") < out.index("## Other figures")


def test_the_read_rate_is_judged_on_per_round_ratios():
    # The disk's rate moves between rounds: the ratio of each round's back-to-back pair counts,
    # not the ratio of the two medians, and the text names the read sizes timed.
    data = section(True, 2.5, 150 * MB, 1.2)
    data["index_rate"].update(ratio=0.78, read_blocks={"1048576": 520e6, "16777216": 480e6})
    found = {t["label"]: t for t in sr.targets(data)}
    (rate,) = (t for t in found.values() if "read rate" in t["label"])
    assert rate["shown"].startswith("0.78 (") and not rate["ok"]
    text = sr.rate_text(data["index_rate"])
    assert "1 MiB (520 MB/s) and 16 MiB (480 MB/s)" in text and "just after" in text
