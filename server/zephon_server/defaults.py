"""The embedded default pipeline: a generated sample corpus and the byte tokenizer.

Used when the server or ``zephon dump`` is given no pipeline. The corpus is written once
under ``<data_dir>/sample-corpus`` (default ``./zephon-data``, or ``$ZEPHON_DATA_DIR``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .engine.corpus import sample_corpus_specs, write_sample_corpus
from .engine.pipeline import Pipeline

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "zephon-data"


def default_data_dir() -> Path:
    """Where the sample corpus lives (``$ZEPHON_DATA_DIR`` or ``./zephon-data``)."""
    return Path(os.environ.get("ZEPHON_DATA_DIR", DEFAULT_DATA_DIR))


def default_pipeline(data_dir: str | os.PathLike[str] | None = None) -> Pipeline:
    """The embedded default: sample corpus (generated on first use), byte tokenizer, batch."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    corpus = root / "sample-corpus"
    marker = corpus / ".complete"
    if not marker.exists():
        log.info("generating the sample corpus under %s", corpus)
        write_sample_corpus(corpus, docs_per_dataset=2000, seed=0)
        marker.write_text("ok\n")
    specs = sample_corpus_specs(corpus)
    return (
        Pipeline(specs, seed=1234, lanes=8, chunk_size=256, flush_every_k_chunks=8)
        .decode_text()
        .tokenize(tokenizer="byte", add_eos=True)
        .batch(microbatch_size=8)
    )
