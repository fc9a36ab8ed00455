"""Turns ``bench/results/bench.json`` into ``docs/benchmarks.md`` and ``docs/benchmarks.png``.

``python -m bench.report`` regenerates both from the last results without measuring again.
The page's tables come from :mod:`bench.tables`; every "why" paragraph (:mod:`bench.why`) is
derived from the measured numbers (rates, CPU seconds, replay counts), so it changes with them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import startup_report
from .common import RESULTS
from .tables import (
    best_rate,
    best_run,
    delivery_table,
    info_table,
    targets_table,
    throughput_table,
)
from .why import why

# isort: split
# The delivery cost's parts, importable from here as before bench.tables held them.
from .tables import DELIVERY_PARTS as DELIVERY_PARTS
from .tables import LEGACY_SERVER_PARTS as LEGACY_SERVER_PARTS
from .tables import delivery_parts as delivery_parts
from .tables import engine_us_per_batch as engine_us_per_batch

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


# -- chart ------------------------------------------------------------------------------


GROUP_COLORS = {"tokenizer": "#9e9e9e", "engine": "#1f77b4", "service": "#ff7f0e"}
"""The bar colour of each group of configurations (others: green)."""


def _bars(results: dict[str, Any]) -> tuple[list[str], list[float], list[str]]:
    """The chart's bars: short label, best Mtokens/s and colour of every configuration run."""
    labels, values, fills = [], [], []
    for case in results["cases"]:
        best = best_run(results, case["key"])
        if best is None:
            continue
        labels.append(case["short"])
        values.append(best["rate"] / 1e6)
        fills.append(GROUP_COLORS.get(case["group"], "#2ca02c"))
    return labels, values, fills


def chart(results: dict[str, Any], path: Path) -> Path:
    """Bar chart of tokens/s per configuration with the tokenizer-only ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, fills = _bars(results)
    base = (best_rate(results, "tokenizer_2") or 0) / 1e6
    fig, ax = plt.subplots(figsize=(10, 5.2), dpi=120)
    bars = ax.bar(range(len(values)), values, color=fills)
    for bar, v in zip(bars, values):
        ax.annotate(
            f"{v:.2f}\n({v / base:.2f}x)" if base else f"{v:.2f}",
            (bar.get_x() + bar.get_width() / 2, v),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
        )
    if base:
        ax.axhline(base, color="black", lw=1, label="tokenizer only, 2 threads (ceiling)")
        ax.axhline(0.9 * base, color="black", lw=1, ls="--", label="service target (0.90x)")
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=9)
    ax.set_ylabel("Mtokens/s (non-padding)")
    ax.set_ylim(0, max([*values, base]) * 1.25)
    m = results["machine"]
    ax.set_title(
        f"Zephon throughput, BPE {results['workload']['vocab_size']}, pack_flat 2048, "
        f"batch 8 — {m['cores']} cores, {m['cpu']}",
        fontsize=10,
    )
    from matplotlib.patches import Patch

    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(color=c, label=g) for g, c in GROUP_COLORS.items()]
    ax.legend(handles=handles, fontsize=8, loc="upper right", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


# -- markdown ---------------------------------------------------------------------------


def allocator_line(results: dict[str, Any]) -> str:
    """Which malloc every row ran with (results before the allocator was recorded: glibc)."""
    library = results.get("allocator")
    if not library:
        return (
            "**Allocator:** glibc malloc in every row (no mimalloc or jemalloc installed; "
            "`zephon serve` would preload one, see docs/operations.md)."
        )
    settings = results.get("allocator_env") or {}
    given = ""
    if settings:
        pairs = " ".join(f"`{k}={v}`" for k, v in settings.items())
        given = f" and the settings `zephon serve` gives it ({pairs}; the trainer clients too)"
    return (
        f"**Allocator:** every row runs with `{library}` preloaded{given}, as `zephon serve "
        "--allocator auto` (the default) runs when it is installed, the tokenizer-only "
        "ceiling included; the rows marked glibc malloc run without it."
    )


def machine_line(results: dict[str, Any]) -> str:
    """The machine and its load average before and after the run (busy: a warning)."""
    m = results["machine"]
    load = m.get("load_before", [0, 0, 0])
    after = m.get("load_after", load)
    busy = max(load[0], after[0]) > 0.5 * m["cores"]
    return (
        f"**Machine:** {m['cores']} cores ({m['cpu']}), {m['memory_gb']:.0f} GB RAM, "
        f"{m['os']}, Python {m['python']}. Load average (1/5/15 min) before the run "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, after it "
        f"{after[0]:.2f} / {after[1]:.2f} / {after[2]:.2f}"
        + (
            " — the machine was busy, so absolute numbers are low and noisy; ratios taken in "
            "the same run are what the targets judge."
            if busy
            else "."
        )
    )


def workload_line(results: dict[str, Any]) -> str:
    """The corpus, tokenizer, pipeline and the fixed work every throughput row delivers."""
    w = results["workload"]
    return (
        f"**Workload:** a generated corpus of {w['documents']:,} documents (web JSONL, books "
        f"JSONL.zst, code Parquet; ~{w['tokens_per_doc']:.0f} BPE tokens per document), a "
        f"byte-level BPE tokenizer (vocab {w['vocab_size']}) trained on {w['tokenizer_sample']} "
        f"of them, pipeline decode → tokenize → pack_flat 2048 → shuffle (buffer "
        f"{w['shuffle_buffer']}) → batch 8, 8 lanes, chunks of {w['chunk_size']} documents, "
        f"k = {w['flush_every_k_chunks']}. Every throughput row delivers the same fixed work: "
        f"the first {w['chunks_per_lane']} chunks of every lane ({w['fixed_docs']:,} documents, "
        f"{results['fixed_tokens'] / 1e6:.1f} M tokens); best of {results['repeat']} runs."
    )


def why_section(results: dict[str, Any]) -> list[str]:
    """The lines of "Why targets are missed" (none when every target is met)."""
    reasons = why(results)
    if not reasons:
        return []
    lines = ["### Why targets are missed", ""]
    for paragraph in reasons:
        lines += [paragraph, ""]
    return lines


def delivery_section(results: dict[str, Any]) -> list[str]:
    """The lines of "Delivery cost per batch" (none without a measurement)."""
    delivery = delivery_table(results)
    if not delivery:
        return []
    return [
        "## Delivery cost per batch",
        "",
        "CPU per batch of each part of delivering a batch over gRPC, measured by "
        "`python -m bench.delivery` (replayed messages, so no tokenizer runs beside it), "
        "against the CPU the in-process engine (threads x2) spends making a batch. The "
        "gRPC rows are a bare `grpc.aio` client and a replay server that only move the "
        "bytes, with an Ack per 4 batches as the client sends at these rates. The tensor "
        "bytes travel in the messages here, as for a client on another host; a client on "
        "the server's host reads them from a shared-memory ring instead (the service rows "
        "above), which leaves the gRPC rows with messages of a few KB.",
        "",
        delivery,
        "",
    ]


def markdown(results: dict[str, Any], png_name: str = "benchmarks.png") -> str:
    """The whole of docs/benchmarks.md, the chart linked as ``png_name``."""
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m bench.run` (make bench); edits are overwritten. -->",
        "",
        f"Produced by `{results['command']}` on {results['date']} "
        f"(took {results.get('duration_s', 0) / 60:.0f} min).",
        "",
        machine_line(results),
        "",
        workload_line(results),
        "",
        allocator_line(results),
        "",
        f"![throughput per configuration]({png_name})",
        "",
        "## Targets",
        "",
        targets_table(results),
        "",
        *why_section(results),
        "## Throughput",
        "",
        throughput_table(results),
        "",
        *delivery_section(results),
        *startup_report.markdown(results.get("startup")),
        "## Other figures",
        "",
        info_table(results),
        "",
        "## Method",
        "",
        *[f"* {item}" for item in results["method"]],
        "",
    ]
    return "\n".join(lines)


README_START = "<!-- bench-table:start"
README_END = "<!-- bench-table:end -->"


def readme_block(results: dict[str, Any]) -> str:
    """The README's benchmark summary: command, machine, the Targets table and the chart."""
    m = results["machine"]
    return "\n".join(
        [
            f"`{results['command']}` on {results['date']}, {m['cores']} cores ({m['cpu']}), "
            f"{m['memory_gb']:.0f} GB RAM, Python {m['python']}:",
            "",
            targets_table(results),
            "",
            "![throughput per configuration](docs/benchmarks.png)",
        ]
    )


def write_readme(results: dict[str, Any], readme: Path) -> bool:
    """Replace the README's block between the bench-table markers; False if it has none."""
    if not readme.exists():
        return False
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        return False
    head, rest = text.split(README_START, 1)
    marker_line, _ = rest.split("\n", 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(
        f"{head}{README_START}{marker_line}\n{readme_block(results)}\n{README_END}{tail}"
    )
    return True


#: Sections of the page other commands publish (``bench.chat_bench``): a run keeps them.
KEPT_SECTIONS = ("## Chat pipeline",)


def kept_sections(page: str) -> list[str]:
    """The :data:`KEPT_SECTIONS` of ``page``, each up to the next ``## `` heading."""
    lines = page.split("\n")
    out = []
    for title in KEPT_SECTIONS:
        start = next((i for i, line in enumerate(lines) if line == title), None)
        if start is not None:
            end = next(
                (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                len(lines),
            )
            out.append("\n".join(lines[start:end]).rstrip("\n") + "\n")
    return out


def with_kept(page: str, sections: list[str]) -> str:
    """``page`` with ``sections`` put back before its ``## Other figures``."""
    if not sections:
        return page
    at = page.find("\n## Other figures")
    at = len(page) if at < 0 else at + 1
    return page[:at] + "".join(s + "\n" for s in sections) + page[at:]


def write(results: dict[str, Any], md: Path, png: Path, readme: Path | None = None) -> None:
    chart(results, png)
    md.parent.mkdir(parents=True, exist_ok=True)
    kept = kept_sections(md.read_text()) if md.exists() else []
    md.write_text(with_kept(markdown(results, png_name=png.name), kept))
    if readme is not None:
        write_readme(results, readme)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default=str(RESULTS / "bench.json"))
    parser.add_argument("--md", default=str(DOCS / "benchmarks.md"))
    parser.add_argument("--png", default=str(DOCS / "benchmarks.png"))
    args = parser.parse_args()
    results = json.loads(Path(args.results).read_text())
    write(results, Path(args.md), Path(args.png), readme=ROOT / "README.md")
    print(targets_table(results))


if __name__ == "__main__":
    main()
