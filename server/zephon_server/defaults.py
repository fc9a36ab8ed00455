"""The embedded default pipeline: a generated sample corpus and the byte tokenizer.

Used when the server or ``zephon dump`` is given no pipeline. The corpus is written once
under ``<data_dir>/sample-corpus`` (default ``./zephon-data``, or ``$ZEPHON_DATA_DIR``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .engine.corpus import sample_corpus_specs, write_sample_corpus
from .engine.datasets import DatasetSpec
from .engine.pipeline import Pipeline

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "zephon-data"


def default_data_dir() -> Path:
    """Where the sample corpus lives (``$ZEPHON_DATA_DIR`` or ``./zephon-data``)."""
    return Path(os.environ.get("ZEPHON_DATA_DIR", DEFAULT_DATA_DIR))


def default_pipeline_specs(data_dir: str | os.PathLike[str] | None = None) -> list[DatasetSpec]:
    """Dataset specs of the sample corpus, generating it on first use."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    corpus = root / "sample-corpus"
    marker = corpus / ".complete"
    if not marker.exists():
        log.info("generating the sample corpus under %s", corpus)
        write_sample_corpus(corpus, docs_per_dataset=2000, seed=0)
        marker.write_text("ok\n")
    return sample_corpus_specs(corpus)


def default_pipeline(data_dir: str | os.PathLike[str] | None = None) -> Pipeline:
    """The embedded default: sample corpus, byte tokenizer, pack_flat + shuffle + batch."""
    specs = default_pipeline_specs(data_dir)
    return (
        Pipeline(specs, seed=1234, lanes=8, chunk_size=256, flush_every_k_chunks=8)
        .decode_text()
        .tokenize(tokenizer="byte", add_eos=True)
        .pack_flat(max_length=1024)
        .shuffle(buffer_size=256, algorithm="streaming")
        .batch(microbatch_size=8)
    )
