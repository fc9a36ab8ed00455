"""The benchmark page's tables (throughput, targets, other figures, delivery cost) and the
figures they show: the rows that have targets and their verdicts, CPU seconds per token, and
what delivering a batch costs against making it. Pure functions of ``bench.json``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from .common import table


def _m(rate: float) -> str:
    """A rate in Mtokens/s, three decimals."""
    return f"{rate / 1e6:.3f}"


def duration(seconds: float) -> str:
    """A duration in µs, ms or s, as the page writes it."""
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _pct(x: float) -> str:
    """A share in percent, one decimal below 10%; a shortfall that would round to 0.0% is
    "less than 0.1%" (a miss is never shown as a miss by nothing)."""
    if 0 < abs(x) < 0.0005:
        return "less than 0.1%"
    return f"{x * 100:.0f}%" if abs(x) >= 0.1 else f"{x * 100:.1f}%"


def verdict(value: float, target: float, kind: str, points: bool = False) -> tuple[bool, str]:
    """("meets" or "misses by ...") for ``value`` against ``target``.

    ``kind`` is ``>=``, ``<=`` or ``<``. A shortfall is relative (``misses by 11%``), or in
    percentage points when the figure itself is a percentage (``points``).
    """
    ok = value >= target if kind == ">=" else value <= target if kind == "<=" else value < target
    if ok:
        return True, "meets"
    if points:
        gap = abs(value - target) * 100
        return False, f"**misses by {'less than 0.1' if gap < 0.05 else f'{gap:.1f}'} points**"
    if kind == ">=":
        return False, f"**misses by {_pct((target - value) / target)}**"
    miss = (value - target) / target if target else math.inf
    text = f"**misses by {_pct(miss)}**"
    if value >= 2 * target:
        text = f"**misses by {_pct(miss)}** ({value / target:.1f}x the limit)"
    return False, text


def best_run(results: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The fastest run of configuration ``key`` (None if it did not run)."""
    return results["best"].get(key)


def _best_field(results: dict[str, Any], key: str, field: str) -> float | None:
    """The largest ``field`` over the runs of ``key`` (None if none, or if steady-state
    rates are not valid for this run)."""
    if field == "steady_rate" and not results.get("steady_valid"):
        return None
    values = [r.get(field) or 0 for r in results["runs"].get(key, [])]
    return max(values) if values and max(values) > 0 else None


def best_rate(results: dict[str, Any], key: str) -> float | None:
    """The tokens/s of the fastest run of ``key`` (None if it did not run)."""
    best = best_run(results, key)
    return best["rate"] if best else None


def ratio_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The ratio figures (with targets where the issue sets one), as computed by bench.run."""
    return results["ratios"]


def target_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every figure that has a target: name, shown value, target text, verdict."""
    rows = []
    for r in ratio_rows(results):
        if r["target"] is None or r["value"] is None:
            continue
        rows.append(
            {
                "key": r["key"],
                "label": r["label"],
                "value": r["value"],
                "shown": r["shown"],
                "target": r["target_text"],
                "ok": r["ok"],
                "verdict": r["verdict"],
            }
        )
    for f in results["figures"]:
        if f.get("target") is None:
            continue
        rows.append(
            {
                "key": f["key"],
                "label": f["label"],
                "value": f["value"],
                "shown": f["shown"],
                "target": f["target_text"],
                "ok": f["ok"],
                "verdict": f["verdict"],
            }
        )
    return rows


def throughput_table(results: dict[str, Any]) -> str:
    """Tokens/s, CPU and time to first batch of every configuration's best run."""
    base = best_rate(results, "tokenizer_2")
    rows = []
    for case in results["cases"]:
        best = best_run(results, case["key"])
        if best is None:
            continue
        runs = results["runs"].get(case["key"], [])
        spread = ""
        if len(runs) > 1:
            lo = min(r["rate"] for r in runs)
            spread = f"{(best['rate'] - lo) / best['rate'] * 100:.0f}%"
        ttfb = best.get("ttfb")
        rows.append(
            [
                case["label"],
                _m(best["rate"]),
                f"{best['rate'] / base:.2f}" if base else "—",
                _m(steady) if (steady := _best_field(results, case["key"], "steady_rate")) else "—",
                f"{best['cores']:.2f}" if "cores" in best and not best.get("cpu_partial") else "—",
                f"{cpu_per_mtok(best):.2f}" if not best.get("cpu_partial") else "—",
                duration(ttfb) if ttfb is not None else "—",
                spread or "—",
            ]
        )
    return table(
        rows,
        [
            "configuration",
            "Mtokens/s",
            "x tokenizer-only (2 threads)",
            "steady state (middle half)",
            "CPU cores busy",
            "CPU s per M tokens",
            "time to first batch",
            "spread of runs",
        ],
    )


def targets_table(results: dict[str, Any]) -> str:
    """The figures that have targets, each with its verdict."""
    rows = [[r["label"], r["shown"], r["target"], r["verdict"]] for r in target_rows(results)]
    return table(rows, ["figure", "measured", "target", "verdict"])


def info_table(results: dict[str, Any]) -> str:
    """The figures without a target, each with its note."""
    rows = []
    for r in ratio_rows(results):
        if r["target"] is None and r["value"] is not None:
            rows.append([r["label"], r["shown"], r.get("note", "")])
    for f in results["figures"]:
        if f.get("target") is None:
            rows.append([f["label"], f["shown"], f.get("note", "")])
    return table(rows, ["figure", "measured", "note"])


# -- CPU per token ----------------------------------------------------------------------


def cpu_seconds(run: dict[str, Any]) -> float:
    """CPU seconds a measurement used: its own process and children, or server and clients."""
    if "server_cpu" in run:
        return float(run["server_cpu"] + run["client_cpu"])
    return float(run.get("cpu_main", 0.0) + (run.get("cpu_children") or 0.0))


def cpu_per_mtok(run: dict[str, Any]) -> float:
    """CPU seconds per million delivered tokens."""
    return cpu_seconds(run) / run["tokens"] * 1e6


def median_cpu_per_mtok(results: dict[str, Any], key: str) -> float | None:
    """The median over a configuration's runs of its CPU seconds per million tokens: the
    machine's speed drifts between runs, so one run's CPU per token is mostly that drift."""
    values = [
        cpu_per_mtok(run)
        for run in results["runs"].get(key, [])
        if run.get("tokens") and not run.get("cpu_partial") and cpu_seconds(run) > 0
    ]
    return statistics.median(values) if values else None


# -- delivery cost ---------------------------------------------------------------------

DELIVERY_PARTS = (
    (
        "server",
        "encode the message bytes (tensors, row sources, closed documents)",
        "server_encode_us",
    ),
    ("server", "gRPC: send the message, receive the Acks", "transport_server_us"),
    ("client", "gRPC: receive the message, send the Acks", "transport_client_us"),
    ("client", "parse and decode the tensors", "client_parse_decode_us"),
    ("client", "verify the content and chain digests (sha256)", "client_verify_us"),
)


LEGACY_SERVER_PARTS = (
    ("server", "build the message (tensors, row sources, closed documents)", "server_build_us"),
    ("server", "serialize it for gRPC", "server_serialize_us"),
    ("server", "serialize it again to count zephon_sent_bytes_total", "server_bytes_metric_us"),
)
"""The server's parts in results written before it encoded messages by hand (re-rendering)."""


def _parts(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The parts ``d`` holds, the server's from either way of building a message."""
    return [p for p in (*LEGACY_SERVER_PARTS, *DELIVERY_PARTS) if p[2] in d]


def engine_us_per_batch(results: dict[str, Any]) -> float | None:
    """CPU microseconds the in-process engine (threads x2) spends per delivered batch."""
    d = results.get("delivery")
    cpu = median_cpu_per_mtok(results, "engine_threads_2")
    if not d or cpu is None:
        return None
    return cpu * d["tokens_per_batch"]  # (s per 1e6 tokens) * tokens * 1e6 us/s / 1e6


def delivery_parts(results: dict[str, Any]) -> tuple[float, float, float] | None:
    """(sum of the parts, of which the gRPC transport, the engine's CPU) in us per batch."""
    d = results.get("delivery")
    engine = engine_us_per_batch(results)
    if not d or engine is None:
        return None
    total = sum(d[key] for _, _, key in _parts(d))
    return total, d["transport_server_us"] + d["transport_client_us"], engine


def _comparisons(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The rows under the sum of the parts: protobuf for comparison (if measured), the whole
    DataClient with and without verification, and grouped messages (if measured)."""
    rows = []
    if "server_protobuf_us" in d:
        rows.append(
            (
                "server",
                "for comparison: the same message built and serialized with protobuf (unused)",
                "server_protobuf_us",
            )
        )
    rows += [
        (
            "client",
            "the real DataClient, whole (transport, decode, verify, hand-off to the trainer)",
            "data_client_us",
        ),
        ("client", "the same without verification (`verify=False`)", "data_client_no_verify_us"),
    ]
    if "data_client_grouped_us" in d:
        group = d["group"]
        rows += [
            (
                "server",
                "gRPC send, one batch per message, while the DataClient reads",
                "data_client_server_us",
            ),
            (
                "server",
                f"the same, {group} batches per message (`BatchGroup`)",
                "data_client_grouped_server_us",
            ),
            (
                "client",
                f"the real DataClient, whole, {group} batches per message",
                "data_client_grouped_us",
            ),
        ]
    return rows


def delivery_table(results: dict[str, Any]) -> str:
    """The per-batch delivery costs as a Markdown table (empty without a measurement)."""
    d = results.get("delivery")
    parts = delivery_parts(results)
    if not d or parts is None:
        return ""
    total, _, engine = parts

    def row(side: str, what: str, key: str) -> list[str]:
        return [side, what, f"{d[key]:.0f}", f"{d[key] / engine:.1%}"]

    rows = [row(*part) for part in _parts(d)]
    rows.append(["", "**sum of the parts**", f"**{total:.0f}**", f"**{total / engine:.1%}**"])
    rows += [row(*part) for part in _comparisons(d)]
    return table(rows, ["side", "part", "CPU µs per batch", "of the engine's CPU per batch"])
