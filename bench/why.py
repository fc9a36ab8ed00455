"""Why targets are missed: the paragraphs under the Targets table of ``docs/benchmarks.md``.

One paragraph per missed target, each derived from the measured numbers (rates, CPU seconds,
replay counts), so it changes with them; none when every target is met. A paragraph explains
a ratio with the runs of the round that gave it its (median) value (:func:`pair`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .tables import (
    cpu_per_mtok,
    delivery_parts,
    duration,
    median_cpu_per_mtok,
    ratio_rows,
    target_rows,
)

MB = 1024 * 1024
Results = dict[str, Any]
Run = dict[str, Any]


def why(results: Results) -> list[str]:
    """One paragraph per missed target, derived from the numbers."""
    missed = {r["key"] for r in target_rows(results) if not r["ok"]}
    paragraphs = (paragraph(results, missed) for paragraph in PARAGRAPHS)
    return [text for text in paragraphs if text]


# -- the numbers a paragraph explains ----------------------------------------------------


def decompose(a: Run, b: Run) -> tuple[float, float]:
    """rate = cores busy / CPU per token, so rate_a / rate_b = busy factor x CPU factor."""
    return a["cores"] / b["cores"], cpu_per_mtok(b) / cpu_per_mtok(a)


def _split(a: Run, b: Run, a_name: str, b_name: str) -> str:
    """The sentence splitting ``a``'s rate against ``b``'s into cores busy x CPU per token."""
    busy, cpu = decompose(a, b)
    return (
        f"Over the whole runs (ratio {a['rate'] / b['rate']:.2f}), tokens/s = "
        f"cores kept busy ÷ CPU seconds per token, so the ratio splits into {busy:.2f} from "
        f"cores kept busy ({a_name} {a['cores']:.2f}, {b_name} {b['cores']:.2f}) times "
        f"{cpu:.2f} from CPU per token ({cpu_per_mtok(a):.2f} against {cpu_per_mtok(b):.2f} "
        "CPU seconds per million tokens)."
    )


def pair(results: Results, ratio_key: str, *keys: str) -> tuple[Run | None, ...]:
    """The runs of ``keys`` from the round that gave ratio ``ratio_key`` its (median) value;
    the best runs for results written before per-round ratios."""
    ratio = next((r for r in results["ratios"] if r["key"] == ratio_key), None)
    i = ratio.get("round") if ratio else None
    if i is None:
        return tuple(results["best"].get(k) for k in keys)
    return tuple(runs[i] if len(runs := results["runs"].get(k, [])) > i else None for k in keys)


def _ratios(results: Results) -> dict[str, dict[str, Any]]:
    """The ratio rows by key."""
    return {r["key"]: r for r in ratio_rows(results)}


def _ratio_value(results: Results, key: str) -> float | None:
    """The value of ratio ``key`` (None if it was not taken)."""
    return _ratios(results).get(key, {}).get("value")


# -- the shared sentences ----------------------------------------------------------------

ENGINE_CPU = (
    ("the tokenizer alone, 1 thread", "tokenizer_1"),
    ("2 threads", "tokenizer_2"),
    ("the engine inline", "engine_inline_1"),
    ("threads x1", "engine_threads_1"),
    ("threads x2", "engine_threads_2"),
    ("the service", "service_1"),
)
"""The configurations whose CPU per token the engine's sentences compare, in order."""


def engine_sentences(results: Results) -> str:
    """Where the engine's CPU per token goes, from tokenizer alone to the service (each
    sentence begins with a space; empty without the numbers)."""
    cpu = {key: median_cpu_per_mtok(results, key) for _, key in ENGINE_CPU}
    return (
        _cpu_chain(results, cpu)
        + _threads_cost(cpu)
        + _inline_cost(cpu)
        + _gil_wait(results["best"])
    )


def _cpu_chain(results: Results, cpu: dict[str, float | None]) -> str:
    """The CPU seconds per million tokens of each configuration that ran, and of the best
    service run's server and client."""
    known = [f"{name} {cpu[key]:.2f}" for name, key in ENGINE_CPU if cpu[key]]
    if not known:
        return ""
    text = " CPU seconds per million tokens (median of each configuration's runs): "
    text += ", ".join(known)
    svc1 = results["best"].get("service_1")
    if svc1:
        text += (
            f" (in the best service run: server "
            f"{svc1['server_cpu'] / svc1['tokens'] * 1e6:.2f}, client "
            f"{svc1['client_cpu'] / svc1['tokens'] * 1e6:.2f})"
        )
    return text + "."


def _threads_cost(cpu: dict[str, float | None]) -> str:
    """What the threads runner (x2) costs per token against running inline."""
    inline_cpu, thr2_cpu = cpu["engine_inline_1"], cpu["engine_threads_2"]
    if not (inline_cpu and thr2_cpu):
        return ""
    extra = thr2_cpu / inline_cpu - 1
    return (
        f" Running the same operators on the threads runner costs {extra * 100:+.0f}% CPU "
        "per token against inline: micro-batches handed between the feeder, driver and "
        "worker threads through queues, GIL hand-offs between the tokenizer threads and "
        "the Python parts (fetch, decode and record building in the tokenizer's worker "
        "threads; packing, shuffling, batching and digests in one driver thread)."
    )


def _inline_cost(cpu: dict[str, float | None]) -> str:
    """What the engine inline costs per token against the tokenizer alone (1 thread): about
    the same, less (noise), or more."""
    inline_cpu, tok1_cpu = cpu["engine_inline_1"], cpu["tokenizer_1"]
    if not (tok1_cpu and inline_cpu):
        return ""
    extra = inline_cpu / tok1_cpu - 1
    if abs(extra) < 0.05:
        return (
            f" Inline, on one core, the engine costs about the CPU per token of the "
            f"tokenizer alone ({extra * 100:+.0f}%, within noise): reading, JSON-decoding, "
            "packing, shuffling, batching and digests are cheap next to tokenization."
        )
    if extra < 0:
        return (
            f" Inline, on one core, the engine measured {extra * 100:+.0f}% CPU per token "
            "against the tokenizer alone, although it does strictly more work: measurement "
            "noise (see the spread column); read the engine's own cost from threads x1 "
            "against inline instead."
        )
    return (
        f" Inline, on one core, the engine costs {extra * 100:+.0f}% CPU per token "
        "against the tokenizer alone: reading and JSON-decoding shards, packing, "
        "shuffling, batching and digests."
    )


def _gil_wait(best: dict[str, Run]) -> str:
    """Whether threads x2 kept clearly fewer cores busy than two tokenizer threads."""
    thr2, tok2 = best.get("engine_threads_2"), best.get("tokenizer_2")
    if not (thr2 and tok2 and thr2["cores"] < 0.9 * tok2["cores"]):
        return ""
    return (
        f" In-process with threads x2 the engine kept {thr2['cores']:.2f} cores busy against "
        f"{tok2['cores']:.2f} for two tokenizer threads: the tokenizer threads wait for the "
        "GIL while the Python parts hold it."
    )


def allocator_sentence(results: Results) -> str:
    """What the preloaded allocator did to the service ratio (empty without glibc rows)."""
    glibc = _ratio_value(results, "service_vs_tokenizer_glibc")
    tok_gain = _ratio_value(results, "allocator_tokenizer")
    svc_gain = _ratio_value(results, "allocator_service")
    if not (results.get("allocator") and glibc and tok_gain and svc_gain):
        return ""
    return (
        f" With glibc malloc in every row the same ratio is {glibc:.2f}: the preloaded "
        f"allocator made the tokenizer alone {tok_gain:.2f}x as fast and the service "
        f"{svc_gain:.2f}x, since it speeds up tokenizing but not the engine's Python work "
        "or the delivery, which therefore weigh more against the faster ceiling."
    )


# -- one paragraph per target ------------------------------------------------------------


def service_vs_tokenizer(results: Results, missed: set[str]) -> str | None:
    """The service (1 rank) against the tokenizer alone: where the rate goes."""
    key = "service_vs_tokenizer"
    p_svc1, p_tok2, p_thr2 = pair(results, key, "service_1", "tokenizer_2", "engine_threads_2")
    if key not in missed or not (p_svc1 and p_tok2):
        return None
    ratio = _ratios(results)[key]
    text = (
        f"**Service end-to-end vs tokenizer-only ({ratio['value']:.3f}, target 0.90, "
        "1 rank).** " + _split(p_svc1, p_tok2, "service", "tokenizer-only")
    )
    if p_thr2:
        field = ratio.get("field", "rate")
        eng, dlv = p_thr2[field] / p_tok2[field], p_svc1[field] / p_thr2[field]
        measure = "steady state" if field == "steady_rate" else "whole run"
        text += (
            f" In the target's measure ({measure}) the engine in-process (threads x2) "
            f"reaches {eng:.2f} of the tokenizer rate "
            f"and delivery over gRPC keeps {dlv:.2f} of that. On this machine the trainer "
            "client and the server's gRPC threads share the 2 cores with the two tokenizer "
            "threads, so every CPU second they use is taken from tokenizing."
        )
    return text + allocator_sentence(results) + engine_sentences(results)


def two_ranks(results: Results, missed: set[str]) -> str | None:
    """The service with two client ranks against one."""
    key = "service2_vs_tokenizer"
    p_svc2, p_svc1 = pair(results, key, "service_2", "service_1")
    if key not in missed or not (p_svc2 and p_svc1):
        return None
    return (
        f"**Two ranks ({_ratios(results)[key]['value']:.3f}).** "
        + _split(p_svc2, p_svc1, "2 ranks", "1 rank")
        + f" The two client processes used {p_svc2['client_cpu'] / p_svc2['seconds']:.2f} "
        f"cores (one client: {p_svc1['client_cpu'] / p_svc1['seconds']:.2f}) and the server "
        f"{p_svc2['server_cpu'] / p_svc2['seconds']:.2f} "
        f"({p_svc1['server_cpu'] / p_svc1['seconds']:.2f}) on {results['machine']['cores']} "
        "cores: a second rank adds streams, decode and verify work but no tokenizer capacity."
    )


def grpc_delivery(results: Results, missed: set[str]) -> str | None:
    """The service against the same engine in-process: what delivery over gRPC costs."""
    key = "grpc_delivery"
    p_svc1, p_thr2 = pair(results, key, "service_1", "engine_threads_2")
    if key not in missed or not (p_svc1 and p_thr2):
        return None
    value = _ratios(results)[key]["value"]
    server = p_svc1["server_cpu"] / p_svc1["tokens"] * 1e6
    client = p_svc1["client_cpu"] / p_svc1["tokens"] * 1e6
    return (
        f"**gRPC delivery ({value:.3f} of in-process, {(1 - value) * 100:.1f}% below).** "
        + _split(p_svc1, p_thr2, "service", "in-process")
        + f" Per million tokens the server process spent {server:.2f} CPU seconds (the "
        f"same engine plus the hub, message encoding and gRPC; its start-up before "
        f"the run is not counted) against {cpu_per_mtok(p_thr2):.2f} in-process, and "
        f"the client {client:.2f} (receiving, decoding and verifying the sha256 content and "
        "chain digest of every batch). With the cores busy, every extra CPU second per "
        "token is throughput lost. Here the client processes run on the same cores as the "
        "server's tokenizer threads; in a deployment they run on the trainers' hosts and "
        "take nothing from the tokenizer."
        + _delivery_cost(results, client)
        + _without_ring(results)
        + _delivery_on_glibc(results)
    )


def _delivery_cost(results: Results, client: float) -> str:
    """The per-batch delivery costs measured part by part (``bench.delivery``), against the
    client's CPU seconds per million tokens in the service runs (``client``)."""
    parts = delivery_parts(results)
    if parts is None:
        return ""
    total, transport, engine = parts
    kib = results["delivery"]["message_bytes"] / 1024
    d = results["delivery"]
    in_service = client * d["tokens_per_batch"]  # client CPU s/Mtok -> us per batch
    return (
        f" Measured part by part (table below, `python -m bench.delivery`), one "
        f"batch costs {total:.0f} µs of CPU to deliver against the engine's "
        f"{engine / 1000:.1f} ms to make it ({total / engine:.1%}); gRPC's own "
        f"per-message work in Python, moving a {kib:.0f} KiB message (and an Ack per "
        f"4), is {transport:.0f} µs of that ({transport / engine:.1%}) before any "
        f"Zephon code runs, and checking the digests on the client "
        f"{d['client_verify_us']:.0f} µs. "
        "The rest of the measured gap is in no single part: contention for the 2 "
        f"cores makes the same work cost more (in the service runs the client used "
        f"{in_service:.0f} µs per batch, against {d['data_client_us']:.0f} µs beside a "
        "replay server instead of two tokenizer threads), and this VM's speed drifts "
        "between the paired runs (see the rounds). With the trainers on their own "
        "hosts, the client's share leaves these cores."
    )


def _without_ring(results: Results) -> str:
    """Delivery with the tensor bytes in the gRPC messages (``--shm-ring-mib 0``)."""
    no_ring = _ratio_value(results, "grpc_delivery_noring")
    if not no_ring:
        return ""
    return (
        " The service rows pass the tensor bytes through the shared-memory ring (the "
        "client is on the server's host), so the per-message figures above, measured "
        "with the bytes in the messages, overstate their transport; with "
        f"`--shm-ring-mib 0` delivery measured {(1 - no_ring) * 100:.1f}% below "
        "in-process."
    )


def _delivery_on_glibc(results: Results) -> str:
    """Delivery with glibc malloc in every row (empty without an allocator preloaded)."""
    on_glibc = _ratio_value(results, "grpc_delivery_glibc")
    if not (results.get("allocator") and on_glibc):
        return ""
    return (
        f" With glibc malloc in every row, where the engine's CPU per batch is higher "
        f"and the same delivery cost weighs less, delivery measured "
        f"{(1 - on_glibc) * 100:.1f}% below in-process."
    )


def processes_scaling(results: Results, missed: set[str]) -> str | None:
    """The processes runner from 1 to 2 workers: the cores it had to scale into."""
    key = "processes_scaling"
    p_proc1, p_proc2 = pair(results, key, "engine_processes_1", "engine_processes_2")
    if key not in missed or not (p_proc1 and p_proc2):
        return None
    ratios = _ratios(results)
    best = results["best"]
    tok1, tok2, thr2 = (best.get(k) for k in ("tokenizer_1", "tokenizer_2", "engine_threads_2"))
    cores = results["machine"]["cores"]
    main1 = p_proc1["cpu_main"] / p_proc1["seconds"]
    main2 = p_proc2["cpu_main"] / p_proc2["seconds"]
    work1 = p_proc1["cpu_children"] / p_proc1["seconds"]
    work2 = p_proc2["cpu_children"] / p_proc2["seconds"]
    text = (
        f"**processes 1 → 2 workers ({ratios[key]['value']:.3f}x, target 1.7x).** "
        + _split(p_proc2, p_proc1, "2 workers", "1 worker")
        + f" The main process (lane source, pack_flat, shuffle, batch, digests, "
        f"shared-memory transfer) used {main1:.2f} and {main2:.2f} cores, the worker "
        f"processes {work1:.2f} and {work2:.2f}. With {cores} cores, two workers and the "
        f"main process share {cores} cores: 1 worker already keeps {p_proc1['cores']:.2f} "
        f"cores busy, so the most 2 workers can reach here is {cores} / "
        f"{p_proc1['cores']:.2f} = {cores / p_proc1['cores']:.2f}x even with no overhead at "
        "all (the target assumes free cores for the second worker)"
    )
    if tok1 and tok2:
        text += (
            f"; on this machine, in the same run, even the tokenizer alone scaled "
            f"{tok2['rate'] / tok1['rate']:.2f}x from 1 to 2 threads"
        )
    return text + (
        f". Worker start-up (spawn, imports, tokenizer load) costs "
        f"{p_proc2['ttfb'] - (thr2 or p_proc2)['ttfb']:.2f} s more time to first batch than "
        "threads x2, which the whole-run ratio "
        f"({ratios.get('processes_scaling_whole', {}).get('shown', '—')}) includes."
    )


def rss_growth(results: Results, missed: set[str]) -> str | None:
    """RSS over the long run, from warm-up to the end."""
    long = results.get("long")
    if "rss_growth" not in missed or not long:
        return None
    return (
        f"**RSS growth ({long['growth'] * 100:.1f}%).** RSS went from "
        f"{long['rss_warm'] / MB:.0f} MB after warm-up (batch {long['warm_batches']}) to "
        f"{long['rss_end'] / MB:.0f} MB at the end of {long['batches']} batches "
        f"(peak {long['rss_peak'] / MB:.0f} MB); the trace is in bench.json (`long.trace`)."
    )


def checkpoint_size(results: Results, missed: set[str]) -> str | None:
    """The checkpoint's bytes: shared by all lanes, and per extra lane (one paragraph for
    both the engine's and the Checkpoint RPC's figure)."""
    res = results.get("resume")
    if not res or not ("checkpoint_engine" in missed or "checkpoint_rpc" in missed):
        return None
    return (
        f"**Checkpoint size.** {res['checkpoint_bytes']} bytes for {res['lanes']} lanes: "
        f"{res['checkpoint_bytes_one_lane']} bytes for one lane (the header, fingerprint "
        f"and component hashes are shared) and "
        f"{res['checkpoint_bytes_marginal_per_lane']:.0f} bytes per extra lane."
    )


def resume_ttfb(results: Results, missed: set[str]) -> str | None:
    """Resume to the first batch: what a resumed lane replays, with and without the cache."""
    res = results.get("resume")
    if not res or "resume_ttfb" not in missed or not results["best"].get("engine_threads_2"):
        return None
    cache = res.get("replay_cache") or {}
    return (
        f"**Resume to first batch ({duration(res['resume_ttfb'])}, target 1 s).** A resumed "
        "lane is regenerated from its last epoch boundary (at most k chunks): read, packed and "
        "shuffled again, with the tokenizer output of the replayed chunks read back from "
        f"the replay cache ({cache.get('hits', 0):,} documents from the cache, "
        f"{cache.get('misses', 0):,} tokenized) and resumed lanes fed one at a time, so "
        "the first lane's batch does not wait for the others' replays. What remains is "
        "reading, decoding, packing and shuffling the replayed documents, and tokenizing "
        "the new documents a lane needs for its first batch. Without the cache the same "
        f"resume took {duration(res['resume_ttfb_uncached'])} to its first batch."
    )


PARAGRAPHS: tuple[Callable[[Results, set[str]], str | None], ...] = (
    service_vs_tokenizer,
    two_ranks,
    grpc_delivery,
    processes_scaling,
    rss_growth,
    checkpoint_size,
    resume_ttfb,
)
"""The paragraphs in the order the page lists them; each gives None unless its target is
missed (and its numbers were measured)."""
