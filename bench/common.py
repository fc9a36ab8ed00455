"""Shared benchmark plumbing: corpus, texts, timing, tables."""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.tokenizer import Tokenizer, load_tokenizer, train_bpe_tokenizer

log = logging.getLogger("bench")
RESULTS = Path(__file__).resolve().parent / "results"


def corpus(docs_per_dataset: int, mean_words: int = 300) -> Path:
    """A generated corpus under bench/results (made once per size)."""
    root = RESULTS / f"corpus-{docs_per_dataset}-{mean_words}"
    if not (root / ".complete").exists():
        log.info("writing corpus %s", root)
        write_sample_corpus(root, docs_per_dataset=docs_per_dataset, seed=0, mean_words=mean_words)
        (root / ".complete").write_text("ok\n")
    return root


def corpus_texts(root: Path) -> list[str]:
    """Every document's text, read through the engine's own reader (no tokenization)."""
    pipe = (
        Pipeline(sample_corpus_specs(root), lanes=1, chunk_size=1024)
        .decode_text()
        .tokenize(tokenizer="byte")
        .batch(microbatch_size=1)
    )
    plan = pipe.plan(ExecutionConfig(runner="inline"))
    cache = plan.ops[0]
    from zephon_server.engine.shards import ShardCache

    cache = ShardCache()
    texts: list[str] = []
    for info in plan.datasets:
        for shard in info.shards:
            values = cache.read_rows(shard, list(range(shard.num_rows)), info.spec.text_field)
            for v in values:
                if isinstance(v, bytes):
                    texts.append(json.loads(v)[info.spec.text_field])
                else:
                    texts.append(str(v))
    return texts


def bpe_tokenizer(texts: list[str], vocab_size: int = 8192) -> str:
    """Path of a BPE tokenizer trained on a sample of ``texts`` (cached by size)."""
    path = RESULTS / f"bpe-{vocab_size}.json"
    if not path.exists():
        log.info("training BPE tokenizer (vocab %d)", vocab_size)
        train_bpe_tokenizer(texts[:5000], path, vocab_size=vocab_size)
    return str(path)


def tokenizer_only_rate(tok: Tokenizer, texts: list[str], threads: int, batch: int = 64) -> float:
    """Tokens/s of the tokenizer alone over ``texts`` in ``batch``-sized calls."""
    groups = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    start = time.perf_counter()
    if threads == 1:
        tokens = sum(len(ids) for g in groups for ids in tok.encode_batch(g))
    else:
        with ThreadPoolExecutor(threads) as pool:
            tokens = sum(sum(len(ids) for ids in r) for r in pool.map(tok.encode_batch, groups))
    return tokens / (time.perf_counter() - start)


def pipeline_rate(pipe: Pipeline, execution: ExecutionConfig) -> tuple[float, int]:
    """(tokens/s, tokens) consuming every batch of ``pipe`` in-process."""
    start = time.perf_counter()
    tokens = 0
    for batch in pipe.run(execution).batches():
        tokens += batch.num_tokens()
    return tokens / (time.perf_counter() - start), tokens


def best_of(n: int, fn: Callable[[], Any]) -> Any:
    """The best (max) of n runs of a rate measurement: machines are noisy."""
    results = [fn() for _ in range(n)]
    return max(results, key=lambda r: r[0] if isinstance(r, tuple) else r)


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(rows: Iterable[list[str]], header: list[str]) -> str:
    rows = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def save(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def compile_sources() -> None:
    """Byte-compile the project's sources, as an install does: with
    ``PYTHONDONTWRITEBYTECODE`` set (some shells and CI set it), every process the benchmark
    starts would otherwise compile the modules it imports again, and start-up figures would
    count it."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for part in ("server", "client"):
        compileall.compile_dir(str(root / part), quiet=1)


def load_tok(spec: str) -> Tokenizer:
    return load_tokenizer(spec)
