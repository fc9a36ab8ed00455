"""The start-up section's figures from its raw runs: medians, allocator ratios, targets, tables.

Pure functions over the plain data :mod:`bench.startup` measures (``bench.json``'s
``startup`` key), so the report can be re-rendered (``python -m bench.report``) and tested
without starting anything. A run is one ``zephon serve`` start::

    {"case": "1,000 shards", "index": "cold", "allocator": "default", "round": 0,
     "to_serving": 2.1, "to_first_batch": 2.4, "rss_serving": 83_000_000, "ran_on": "mimalloc"}

``index`` is ``cold`` or ``warm`` when ``zephon serve --index-dir`` exists, else ``n/a`` (every
start then counts every shard, and no warm figure is claimed).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from .common import table

MB = 1024 * 1024
ALLOCATORS = ("default", "system")
"""``zephon serve --allocator auto`` (the default) and ``--allocator system`` (glibc)."""
NOT_AVAILABLE = "n/a"
WARM_TTFB_TARGET = 3.0  # s, warm index, 10,000 shards, to the first batch
RSS_SPREAD_TARGET = 100 * MB  # RSS at SERVING, 10,000 shards vs 100 shards
REFERENCE_TTFB_TARGET = 1.5  # s, warm index, the reference workload, to the first batch
INDEX_RATE_TARGET = 0.80  # zephon index --workers 1 vs the disk's sequential read rate
FIELDS = ("to_serving", "to_first_batch", "rss_serving", "cpu_serving")


def supports_index_dir(serve_help: str) -> bool:
    """Whether ``zephon serve --help`` lists ``--index-dir`` (the persisted shard index)."""
    return any(word.strip(",[]") == "--index-dir" for word in serve_help.split())


def allocator_from_log(text: str) -> str:
    """What the server's ``memory allocator:`` log line says it runs on (``?`` if absent)."""
    for line in text.splitlines():
        _, sep, rest = line.partition("memory allocator: ")
        if sep:
            if rest.startswith("glibc malloc"):
                return "glibc"
            return rest.split(" ", 1)[0].split(";", 1)[0] or "?"
    return "?"


def _key(run: dict[str, Any]) -> tuple[str, str, str]:
    return run["case"], run["index"], run["allocator"]


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (case, index, allocator) in first-seen order: the median of each field
    over the rounds, and the per-round values of the time to the first batch."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(_key(run), []).append(run)
    rows = []
    for (case, index, alloc), group in groups.items():
        row: dict[str, Any] = {"case": case, "index": index, "allocator": alloc}
        for field in FIELDS:
            values = [r[field] for r in group if r.get(field) is not None]
            row[field] = statistics.median(values) if values else None
        row["ran_on"] = sorted({r.get("ran_on", "?") for r in group})
        row["rounds"] = [r["to_first_batch"] for r in sorted(group, key=lambda r: r["round"])]
        row["shards"] = group[0].get("shards")
        rows.append(row)
    return rows


def allocator_ratios(runs: Sequence[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """Default / system ``field`` per (case, index): the median of the per-round ratios (the
    two starts of a round run back to back, so a drift of the machine cancels)."""
    by_round: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for run in runs:
        cell = by_round.setdefault((run["case"], run["index"]), {})
        cell.setdefault(run["round"], {})[run["allocator"]] = run[field]
    out = []
    for (case, index), rounds in by_round.items():
        ratios = [
            pair["default"] / pair["system"]
            for _, pair in sorted(rounds.items())
            if pair.get("default") and pair.get("system")
        ]
        if ratios:
            value = statistics.median(ratios)
            out.append({"case": case, "index": index, "value": value, "rounds": ratios})
    return out


def _row(rows: Iterable[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _verdict(ok: bool, miss: str) -> str:
    return "meets" if ok else f"**misses: {miss}**"


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's targets, each ``{label, shown, target, ok, verdict}``."""
    rows = summarize(section.get("runs", []))
    warm = "warm" if section.get("index_dir") else NOT_AVAILABLE
    note = "" if section.get("index_dir") else " (index: not available, every shard counted)"
    ref = section.get("reference_case")
    longest = section.get("reference_longest_case")
    counts = [r for r in rows if r["case"] not in (ref, longest) and r["index"] == warm]
    counts = [r for r in counts if r["allocator"] == "default" and r.get("shards")]
    out = []
    if counts:
        small = min(counts, key=lambda r: r["shards"])
        big = max(counts, key=lambda r: r["shards"])
        out.append(_warm_target(big, note))
        if big is not small:
            out.append(_rss_target(big, small, note))
    for case in (ref, longest):
        row = _row(rows, case=case, index=warm, allocator="default") if case else None
        if row is not None:
            out.append(_reference_target(case, row, note))
    out += _index_rate_target(section.get("index_rate"))
    out += _allocator_targets(section.get("runs", []))
    return out


def _reference_target(case: str, row: dict[str, Any], note: str) -> dict[str, Any]:
    value = row["to_first_batch"]
    ok = value <= REFERENCE_TTFB_TARGET
    return {
        "label": f"reference workload ({case}), warm index: launch to first batch{note}",
        "shown": _s(value),
        "target": f"≤ {REFERENCE_TTFB_TARGET} s",
        "ok": ok,
        "verdict": _verdict(ok, f"{value / REFERENCE_TTFB_TARGET:.1f}x the limit"),
    }


def _warm_target(big: dict[str, Any], note: str) -> dict[str, Any]:
    value = big["to_first_batch"]
    ok = value <= WARM_TTFB_TARGET and big["shards"] >= 10_000
    verdict = _verdict(ok, f"{value / WARM_TTFB_TARGET:.1f}x the limit")
    return {
        "label": f"warm index, {big['case']}: launch to first batch{note}",
        "shown": _s(value),
        "target": f"≤ {WARM_TTFB_TARGET:.0f} s at 10,000 shards",
        "ok": ok,
        "verdict": verdict if big["shards"] >= 10_000 else "not measured at 10,000 shards",
    }


def _rss_target(big: dict[str, Any], small: dict[str, Any], note: str) -> dict[str, Any]:
    spread = big["rss_serving"] - small["rss_serving"]
    ok = spread <= RSS_SPREAD_TARGET
    return {
        "label": f"RSS at SERVING, {big['case']} vs {small['case']}{note}",
        "shown": f"{spread / MB:+.0f} MB ({small['rss_serving'] / MB:.0f} → "
        f"{big['rss_serving'] / MB:.0f} MB)",
        "target": f"≤ +{RSS_SPREAD_TARGET / MB:.0f} MB",
        "ok": ok,
        "verdict": _verdict(ok, f"{(spread - RSS_SPREAD_TARGET) / MB:.0f} MB over"),
    }


def _index_rate_target(rate: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not rate:
        return []
    value = rate.get("ratio") or rate["index_rate"] / rate["disk_rate"]
    ok = value >= INDEX_RATE_TARGET
    return [
        {
            "label": f"{rate['how']} read rate on plain JSONL / the disk's sequential read "
            "rate, one worker, files dropped from the page cache (median of per-round ratios)",
            "shown": f"{value:.2f} ({rate['index_rate'] / 1e6:.0f} vs "
            f"{rate['disk_rate'] / 1e6:.0f} MB/s)",
            "target": f"≥ {INDEX_RATE_TARGET:.2f}",
            "ok": ok,
            "verdict": _verdict(ok, f"{(INDEX_RATE_TARGET - value) * 100:.0f} points short"),
        }
    ]


def _allocator_targets(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for field, what in (("to_first_batch", "to first batch"), ("to_serving", "to SERVING")):
        ratios = allocator_ratios(runs, field)
        if not ratios:
            continue
        worst = max(ratios, key=lambda r: r["value"])
        ok = worst["value"] <= 1.0
        each = ", ".join(f"{r['case']} {r['index']}: {r['value']:.2f}" for r in ratios)
        pooled = statistics.geometric_mean([v for r in ratios for v in r["rounds"]])
        shown = (
            f"worst {worst['value']:.2f} ({worst['case']}, {worst['index']} index); {each}; "
            f"every path and round pooled: {pooled:.2f} (geometric mean)"
        )
        out.append(
            {
                "label": f"default allocator / --allocator system, time {what}, every path "
                "(median of per-round ratios)",
                "shown": shown,
                "target": "≤ 1.00 on every path",
                "ok": ok,
                "verdict": _verdict(ok, f"{worst['value']:.2f} on {worst['case']}"),
            }
        )
    return out


def runs_table(section: dict[str, Any]) -> str:
    """Case, index, allocator, to SERVING, to first batch, RSS and CPU at SERVING (medians;
    the CPU counts both images of a re-executed server)."""
    rows = []
    for r in summarize(section.get("runs", [])):
        alloc = "default (auto)" if r["allocator"] == "default" else "`--allocator system`"
        ran = ", ".join(r["ran_on"])
        rounds = ", ".join(f"{v:.2f}" for v in r["rounds"])
        rows.append(
            [
                r["case"],
                "not available" if r["index"] == NOT_AVAILABLE else r["index"],
                f"{alloc}: {ran}",
                _s(r["to_serving"]),
                f"{_s(r['to_first_batch'])} [{rounds}]"
                if len(r["rounds"]) > 1
                else _s(r["to_first_batch"]),
                f"{r['rss_serving'] / MB:.0f} MB",
                "" if r["cpu_serving"] is None else f"{r['cpu_serving']:.2f} s",
            ]
        )
    header = ["case", "index", "allocator: ran on", "to SERVING", "to first batch", "RSS"]
    header.append("server CPU to SERVING")
    return table(rows, header)


def targets_table(section: dict[str, Any]) -> str:
    """The section's targets as a Markdown table."""
    rows = [[t["label"], t["shown"], t["target"], t["verdict"]] for t in targets(section)]
    return table(rows, ["figure", "measured", "target", "verdict"])


def markdown(section: dict[str, Any] | None) -> list[str]:
    """The ``## Start-up`` section of docs/benchmarks.md (no lines without a section)."""
    if not section:
        return []
    lines = ["## Start-up", "", *section.get("method", []), ""]
    lines += [targets_table(section), "", runs_table(section), ""]
    rate = section.get("index_rate")
    if rate:
        lines += [rate_text(rate), ""]
    if section.get("storage"):
        lines += [section["storage"], ""]
    return lines


def rate_text(rate: dict[str, Any]) -> str:
    """The paragraph under the table: how the read rates were taken."""
    check = rate["fadvise"]
    works = "works" if check["cold_rate"] < 0.8 * check["warm_rate"] else "had no clear effect"
    return (
        f"Read rates over {rate['files']} plain JSONL files ({rate['bytes'] / 1e6:.0f} MB), "
        "each dropped from the page cache (`fsync`, then `posix_fadvise(POSIX_FADV_DONTNEED)`) "
        f"before it is read: the disk {rate['disk_rate'] / 1e6:.0f} MB/s ({_read_blocks(rate)}), "
        f"{rate['how']} {rate['index_rate'] / 1e6:.0f} MB/s. Dropping {works} here: "
        f"a dropped file read at {check['cold_rate'] / 1e6:.0f} MB/s, the same file from the "
        f"page cache at {check['warm_rate'] / 1e6:.0f} MB/s. {rate.get('note', '')}".rstrip()
    )


def _read_blocks(rate: dict[str, Any]) -> str:
    """How the disk's rate was read: the faster of the read sizes, each round."""
    blocks = rate.get("read_blocks")
    if not blocks:
        return "16 MiB `readinto` calls"
    sizes = " and ".join(
        f"{int(block) >> 20} MiB ({value / 1e6:.0f} MB/s)" for block, value in blocks.items()
    )
    return (
        f"the faster, in each round, of `readinto` calls of {sizes} into a page-aligned "
        "buffer, each the mean of a read just before and one just after that round's index "
        "build"
    )


def replace_section(page: str, section: dict[str, Any], provenance: str) -> str:
    """``page`` (docs/benchmarks.md) with its ``## Start-up`` section replaced by this one
    (inserted before ``## Other figures`` when it has none), every other line kept: a
    start-up run alone must not re-render the figures of another run."""
    lines = page.split("\n")
    new = markdown(section)
    new[1:1] = ["", provenance]
    start = next((i for i, line in enumerate(lines) if line == "## Start-up"), None)
    if start is None:
        at = next((i for i, line in enumerate(lines) if line == "## Other figures"), len(lines))
        return "\n".join([*lines[:at], *new, *lines[at:]])
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join([*lines[:start], *new, *lines[end:]])
