"""The Ray runner's overhead against threads, in-process, on this machine.

:func:`ray_vs_threads` returns the figures (``python -m bench.ray_bench`` prints them as a
table and saves ``bench/results/ray.json``). Two workloads over the same generated corpus and
a BPE tokenizer trained on it (:func:`~zephon_server.engine.tokenizer.train_bpe_tokenizer`):

* ``tokenize``: decode → tokenize(BPE) → batch(8). The tokenizer releases the GIL, so two
  threads already keep two cores busy: this measures what Ray costs (pickling micro-batches
  through the object store, actor dispatch, result relay) for no gain in parallelism.
* ``python_map``: the same plus a ``map_transform`` doing pure-Python work per token, which
  holds the GIL: threads cannot run it on two cores at once, Ray actors (processes) can.

Each workload runs with ``workers=2`` as ``threads`` (every stage on threads), as ``ray`` (the
per-record operators with ``placement="remote"``: two Ray actors; everything else unchanged)
and, for reference, as ``processes`` (the map-like stage on two spawned processes). All deliver
identical batches (checked: the per-lane chain digests are equal).
Figures per configuration: tokens/s over the whole run (including starting the actors),
time to first batch, and the steady rate after the first batch; plus the one-off
``ray.init`` time. Repeats are interleaved and the best run is kept.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.tokenizer import train_bpe_tokenizer

log = logging.getLogger("bench.ray")

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = ("tokenize", "python_map")
CONFIGS = ("threads", "ray", "processes")
#: Passes of pure-Python work over each record's token ids in the ``python_map`` workload.
PYTHON_ROUNDS = 32


def python_heavy(payload: dict[str, Any]) -> dict[str, Any]:
    """GIL-bound per-record work (a rolling hash over the ids); returns the payload as is."""
    ids = payload["input_ids"].tolist()
    h = 0
    for _ in range(PYTHON_ROUNDS):
        for t in ids:
            h = (h * 1_000_003 + t) & 0xFFFFFFFF
    return payload


def prepare(root: Path, docs_per_dataset: int, mean_words: int = 300) -> tuple[Path, str]:
    """A generated corpus and a BPE tokenizer trained on its first documents (cached)."""
    corpus = root / f"corpus-{docs_per_dataset}-{mean_words}"
    if not (corpus / ".complete").exists():
        write_sample_corpus(
            corpus, docs_per_dataset=docs_per_dataset, seed=0, mean_words=mean_words
        )
        (corpus / ".complete").write_text("ok\n")
    tokenizer = root / f"bpe-4096-{docs_per_dataset}-{mean_words}.json"
    if not tokenizer.exists():
        texts = [
            json.loads(line)["text"]
            for path in sorted(corpus.glob("web/*.jsonl"))
            for line in path.read_text().splitlines()
        ]
        train_bpe_tokenizer(texts[:3000], tokenizer, vocab_size=4096)
    return corpus, str(tokenizer)


def execution(config: str, workers: int) -> ExecutionConfig:
    """``ray`` differs from ``threads`` only by the remote placement of its operators."""
    return ExecutionConfig(
        runner="processes" if config == "processes" else "threads", workers=workers
    )


def build(corpus: Path, tokenizer: str, workload: str, config: str) -> Pipeline:
    placement = "remote" if config == "ray" else "local"
    pipe = Pipeline(sample_corpus_specs(corpus), seed=1, lanes=8, chunk_size=256)
    pipe.decode_text().tokenize(tokenizer=tokenizer, add_eos=False, placement=placement)
    if workload == "python_map":
        pipe.map_transform(python_heavy, placement=placement)
    return pipe.batch(microbatch_size=8)


def measure(pipe: Pipeline, execution: ExecutionConfig) -> dict[str, Any]:
    """One run to the end: tokens/s overall and after the first batch, first-batch time."""
    start = time.perf_counter()
    first = None
    tokens = tokens_after_first = 0
    chains: dict[int, str] = {}
    run = pipe.run(execution)
    for batch in run.batches():
        n = batch.num_tokens()
        if first is None:
            first = time.perf_counter()
        else:
            tokens_after_first += n
        tokens += n
        chains[batch.lane_id] = batch.chain_digest.hex()
    end = time.perf_counter()
    assert first is not None, "the workload produced no batch"
    return {
        "seconds": end - start,
        "tokens": tokens,
        "tokens_per_s": tokens / (end - start),
        "first_batch_s": first - start,
        "steady_tokens_per_s": tokens_after_first / max(end - first, 1e-9),
        "chains": chains,
    }


def ray_vs_threads(
    *,
    docs_per_dataset: int = 1500,
    workers: int = 2,
    repeat: int = 2,
    workloads: tuple[str, ...] = WORKLOADS,
    root: Path = RESULTS / "ray-bench",
) -> dict[str, Any]:
    """Ray-vs-threads figures for the benchmark report (see the module docstring).

    Returns ``{"machine", "documents", "workers", "ray_init_s", "workloads": {name:
    {"threads": {...}, "ray": {...}, "processes": {...}, "ratio": Ray/threads tokens/s,
    "steady_ratio": the same after the first batch, "processes_ratio": processes/threads}}}``;
    each configuration's figures are those of :func:`measure` (best of ``repeat``, chains
    dropped).
    """
    import ray

    from zephon_server.engine.runners.ray import SESSION

    corpus, tokenizer = prepare(root, docs_per_dataset)
    started = time.perf_counter()
    already = ray.is_initialized()
    SESSION.acquire(None)  # keeps one local Ray up across the runs (each run makes its actors)
    ray_init_s = 0.0 if already else time.perf_counter() - started
    try:
        results: dict[str, Any] = {}
        for workload in workloads:
            best: dict[str, dict[str, Any]] = {}
            for _ in range(repeat):
                for config in CONFIGS:
                    pipe = build(corpus, tokenizer, workload, config)
                    figures = measure(pipe, execution(config, workers))
                    log.info(
                        "%s %s: %.2f Mtokens/s (steady %.2f), first batch %.2f s",
                        workload,
                        config,
                        figures["tokens_per_s"] / 1e6,
                        figures["steady_tokens_per_s"] / 1e6,
                        figures["first_batch_s"],
                    )
                    if config not in best or figures["tokens_per_s"] > best[config]["tokens_per_s"]:
                        best[config] = figures
            for config in CONFIGS:
                if best[config]["chains"] != best["threads"]["chains"]:
                    raise AssertionError(
                        f"{workload}: {config} and threads delivered other batches"
                    )
            for figures in best.values():
                figures.pop("chains")
            results[workload] = {
                **best,
                "ratio": best["ray"]["tokens_per_s"] / best["threads"]["tokens_per_s"],
                "steady_ratio": best["ray"]["steady_tokens_per_s"]
                / best["threads"]["steady_tokens_per_s"],
                "processes_ratio": best["processes"]["tokens_per_s"]
                / best["threads"]["tokens_per_s"],
            }
    finally:
        SESSION.release()
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, Ray {ray.__version__}",
        "documents": 3 * docs_per_dataset,
        "workers": workers,
        "ray_init_s": ray_init_s,
        "workloads": results,
    }


def table(figures: dict[str, Any]) -> str:
    rows = [
        "| workload | configuration | Mtokens/s | steady Mtokens/s | first batch (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for workload, res in figures["workloads"].items():
        for config in CONFIGS:
            f = res[config]
            rows.append(
                f"| {workload} | {config} x{figures['workers']} | {f['tokens_per_s'] / 1e6:.2f} "
                f"| {f['steady_tokens_per_s'] / 1e6:.2f} | {f['first_batch_s']:.2f} |"
            )
        rows.append(
            f"| {workload} | **Ray / threads** | **{res['ratio']:.2f}** "
            f"| **{res['steady_ratio']:.2f}** | |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=1500, help="documents per dataset (x3)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure (best kept)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    figures = ray_vs_threads(docs_per_dataset=args.docs, workers=args.workers, repeat=args.repeat)
    print(
        f"\nMachine: {figures['machine']}; {figures['documents']} documents; "
        f"ray.init {figures['ray_init_s']:.1f} s\n"
    )
    print(table(figures))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ray.json").write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
