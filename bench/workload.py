"""The benchmark's workload: corpus, tokenizer, pipeline configs and the fixed unit of work.

Every throughput figure of ``bench.run`` measures the same **fixed work**: the first
``chunks_per_lane`` chunks of every lane of the throughput pipeline (``PipelineRun``'s
``max_chunks_per_lane``; the server gets the same limit through ``bench.service``). A run ends
when every lane has ended, so nothing produced is left in a buffer uncounted (the shuffle
reservoirs, the runner queues and the server's per-lane lookahead all drain into the
measurement) and every configuration delivers exactly the same batches. The tokenizer-only
baseline tokenizes the texts of exactly those documents.

The workload is described by a small JSON-able :class:`Workload` so that measurement child
processes (``bench.measure``, ``bench.service``) load the very same pipeline from the same
YAML file as the server does.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from zephon_server.engine.config import load_config
from zephon_server.engine.corpus import sample_corpus_specs
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.planner import Plan
from zephon_server.engine.shards import ShardCache
from zephon_server.engine.tokenizer import load_tokenizer, train_bpe_tokenizer
from zephon_server.engine.work_source import WorkSource
from zephon_server.runtime import RuntimeConfig, from_environ

from .common import RESULTS, corpus

log = logging.getLogger("bench")

LANES = 8
SEED = 1234
MAX_LENGTH = 2048
MICROBATCH = 8
VOCAB_SIZE = 8192
TOKENIZER_SAMPLE = 5000  # documents the BPE tokenizer is trained on


@dataclass
class Workload:
    """Everything a measurement process needs, as plain data (see the module docstring)."""

    corpus: str  # corpus root
    documents: int  # documents in the corpus (all datasets)
    tokenizer: str  # tokenizer.json path
    config: str  # throughput pipeline YAML (lanes 8, chunk_size, k, pack, shuffle, batch 8)
    resume_config: str  # the same ops with the resume geometry (chunk 1024, k 8 by default)
    chunk_size: int
    flush_every_k_chunks: int
    shuffle_buffer: int
    resume_chunk_size: int
    resume_k: int
    chunks_per_lane: int  # the fixed work: this many chunks of every lane
    tokens_per_doc: float  # estimate (tokens incl. EOS per document), sizes the fixed work
    work_dir: str  # scratch directory for this bench run (configs, state dirs, logs)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Workload:
        return cls(**json.loads(text))

    @property
    def fixed_docs(self) -> int:
        return LANES * self.chunks_per_lane * self.chunk_size


def write_config(
    path: Path,
    corpus_root: Path,
    tokenizer: str,
    *,
    chunk_size: int,
    k: int,
    shuffle_buffer: int,
) -> Path:
    """The benchmark pipeline as YAML: decode → tokenize → pack_flat 2048 → shuffle → batch 8."""
    datasets = []
    for spec in sample_corpus_specs(corpus_root):
        entry: dict[str, Any] = {"name": spec.name, "path": spec.path, "weight": spec.weight}
        if spec.text_field != "text":
            entry["text_field"] = spec.text_field
        datasets.append(entry)
    cfg = {
        "seed": SEED,
        "lanes": LANES,
        "chunk_size": chunk_size,
        "flush_every_k_chunks": k,
        # Throughput of the whole fixed work on every lane: with the default (shortest), the
        # batches past the shortest lane's end would be produced but not delivered.
        "end_of_data": "longest",
        "datasets": datasets,
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": tokenizer}},
            {"pack_flat": {"max_length": MAX_LENGTH}},
            {"shuffle": {"buffer_size": shuffle_buffer}},
            {"batch": {"microbatch_size": MICROBATCH}},
        ],
        "execution": {"runner": "threads", "workers": 2},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def runtime() -> RuntimeConfig:
    """The process tuning ``zephon serve`` would run with in this environment (``ZEPHON_GC``
    and the rest): the benchmark applies it in-process and hands it to its workers."""
    return from_environ(os.environ)


def load_plan(config: str, runner: str = "threads", workers: int = 2) -> Plan:
    """The compiled plan of a benchmark YAML for one runner configuration; its workers are
    tuned as the server's are."""
    pipeline, _ = load_config(config)
    return pipeline.plan(ExecutionConfig(runner=runner, workers=workers, worker_tuning=runtime()))


def fixed_work_chunks(plan: Plan, chunks_per_lane: int) -> list[Any]:
    """The chunks of the fixed work in the lane source's order (one chunk per lane in turn)."""
    p = plan.pipeline
    ws = WorkSource(plan.datasets, seed=p.seed, lanes=p.lanes, chunk_size=p.chunk_size)
    streams = [ws.lane_chunks(lane, 0) for lane in range(p.lanes)]
    chunks = []
    for _ in range(chunks_per_lane):
        for stream in streams:
            chunk = next(stream, None)
            if chunk is not None:
                chunks.append(chunk)
    return chunks


def read_texts(plan: Plan, refs: Iterable[tuple[int, int, int]]) -> list[str]:
    """The texts of documents ``(dataset, shard, row)``, in the given order."""
    refs = list(refs)
    cache = ShardCache()
    wanted: dict[tuple[int, int], list[int]] = {}
    for ds, shard, row in refs:
        wanted.setdefault((ds, shard), []).append(row)
    found: dict[tuple[int, int, int], str] = {}
    for (ds, shard), rows in wanted.items():
        info = plan.datasets[ds]
        field = info.spec.text_field
        values = cache.read_rows(info.shards[shard], rows, field)
        for row, value in zip(rows, values):
            if isinstance(value, bytes | bytearray | memoryview):
                found[(ds, shard, row)] = json.loads(bytes(value))[field]
            else:
                found[(ds, shard, row)] = str(value)
    return [found[ref] for ref in refs]


def fixed_work_texts(work: Workload) -> list[str]:
    """The texts of every document of the fixed work, in the order the engine reads them."""
    plan = load_plan(work.config, "inline", 1)
    refs: list[tuple[int, int, int]] = []
    for chunk in fixed_work_chunks(plan, work.chunks_per_lane):
        refs.extend((int(d), int(s), int(r)) for d, s, r, _ in chunk.docs.tolist())
    return read_texts(plan, refs)


def prepare(
    *,
    docs: int,
    mean_words: int,
    token_budget: float,
    chunk_size: int,
    k: int,
    shuffle_buffer: int,
    resume_chunk_size: int,
    resume_k: int,
    work_dir: Path,
) -> Workload:
    """Write (or reuse) the corpus and tokenizer, write the configs, size the fixed work."""
    per_dataset = max(1, -(-docs // 3))  # three datasets, at least ``docs`` in all
    root = corpus(per_dataset, mean_words)
    tok_path = RESULTS / f"bpe-{VOCAB_SIZE}-{root.name}.json"
    config = work_dir / "pipeline.yaml"
    # A provisional config (byte tokenizer) gives the work source for sampling documents.
    write_config(config, root, "byte", chunk_size=chunk_size, k=k, shuffle_buffer=shuffle_buffer)
    plan = load_plan(str(config), "inline", 1)
    documents = sum(d.num_rows for d in plan.datasets)
    sample_refs: list[tuple[int, int, int]] = []
    for chunk in fixed_work_chunks(plan, max(1, math.ceil(TOKENIZER_SAMPLE / chunk_size / LANES))):
        sample_refs.extend((int(d), int(s), int(r)) for d, s, r, _ in chunk.docs.tolist())
    sample = read_texts(plan, sample_refs[:TOKENIZER_SAMPLE])
    if not tok_path.exists():
        log.info("training a BPE tokenizer (vocab %d) on %d documents", VOCAB_SIZE, len(sample))
        tmp = tok_path.with_name(tok_path.name + ".tmp.json")
        train_bpe_tokenizer(sample, tmp, vocab_size=VOCAB_SIZE)
        tmp.replace(tok_path)
    tok = load_tokenizer(str(tok_path))
    tokens_per_doc = 1 + sum(len(ids) for ids in tok.encode_batch(sample)) / len(sample)  # + EOS
    chunks_per_lane = max(1, math.ceil(token_budget / (tokens_per_doc * chunk_size * LANES)))
    max_chunks = documents // (chunk_size * LANES)
    if chunks_per_lane > max_chunks:
        log.warning(
            "token budget %.3g needs %d chunks per lane; the corpus has %d: using %d",
            token_budget,
            chunks_per_lane,
            max_chunks,
            max_chunks,
        )
        chunks_per_lane = max(1, max_chunks)
    write_config(
        config, root, str(tok_path), chunk_size=chunk_size, k=k, shuffle_buffer=shuffle_buffer
    )
    resume_config = write_config(
        work_dir / "pipeline-resume.yaml",
        root,
        str(tok_path),
        chunk_size=resume_chunk_size,
        k=resume_k,
        shuffle_buffer=shuffle_buffer,
    )
    return Workload(
        corpus=str(root),
        documents=documents,
        tokenizer=str(tok_path),
        config=str(config),
        resume_config=str(resume_config),
        chunk_size=chunk_size,
        flush_every_k_chunks=k,
        shuffle_buffer=shuffle_buffer,
        resume_chunk_size=resume_chunk_size,
        resume_k=resume_k,
        chunks_per_lane=chunks_per_lane,
        tokens_per_doc=tokens_per_doc,
        work_dir=str(work_dir),
    )
