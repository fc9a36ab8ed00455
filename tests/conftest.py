"""Shared fixtures: a small real corpus (JSONL, JSONL.zst, Parquet) made per session.

The test suite never writes to the real ``~/.cache``: ``XDG_CACHE_HOME`` points at a temporary
directory for the whole session, so the default shard index directory of every ``zephon``
command the tests run (in-process or as a subprocess, which inherits the environment) is
``<tmp>/zephon/index``.

The test process runs the engine tuned as the ``zephon`` commands run it (malloc arenas,
tokenizer threading: ``RuntimeConfig.apply_process``); importing the engine does no tuning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon_server.engine.corpus import write_sample_corpus
from zephon_server.runtime import from_environ


@pytest.fixture(scope="session", autouse=True)
def tuned_process() -> None:
    """Tune this process once as ``zephon dump`` would (its garbage collector excepted)."""
    from_environ(os.environ).apply_process()


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory) -> Iterator[Path]:
    """``XDG_CACHE_HOME`` for the session: a temporary directory (see the module docstring)."""
    old = os.environ.get("XDG_CACHE_HOME")
    home = tmp_path_factory.mktemp("xdg-cache")
    os.environ["XDG_CACHE_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


def _own_blocks() -> set[str]:
    """This process's shared-memory blocks (named after its pid, workers' blocks included)."""
    prefix = f"zephon-blk-{os.getpid()}-"
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except OSError:
        return set()


@pytest.fixture(autouse=True)
def own_shared_memory_blocks() -> Iterator[None]:
    """Name a test that leaves shared-memory blocks of this process behind, with a warning in
    the summary: a later test that checks ``/dev/shm`` for its own blocks would otherwise take
    the blame (as one did in CI, for a leak of an earlier test)."""
    before = _own_blocks()
    yield
    left = _own_blocks() - before
    if left:
        warnings.warn(f"left in /dev/shm by this test: {sorted(left)}", stacklevel=1)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(root, docs_per_dataset=150, seed=7)
    return root


@pytest.fixture(scope="session")
def corpus_specs(corpus_dir):
    from zephon_server.engine.corpus import sample_corpus_specs

    return sample_corpus_specs(corpus_dir)


@pytest.fixture(scope="session")
def larger_specs(tmp_path_factory):
    """A sample corpus of about four chunks of 256 documents per lane (of four): enough for a
    lane's first batch to wait for several chunks behind a large shuffle buffer."""
    from zephon_server.engine.corpus import sample_corpus_specs

    root = tmp_path_factory.mktemp("larger")
    write_sample_corpus(root, docs_per_dataset=1400, seed=7)
    return sample_corpus_specs(root)


@pytest.fixture(scope="session")
def stream_config(tmp_path_factory, corpus_dir):
    """The service tests' pipeline over the corpus (4 lanes, pack + shuffle) and a work dir."""
    from zephon_testing.servers import write_config

    work = tmp_path_factory.mktemp("stream")
    return write_config(work / "pipeline.yaml", corpus_dir), work


@pytest.fixture(scope="session")
def stream_expected(stream_config):
    """Every lane's chain digests of ``stream_config`` from ``zephon dump`` (inline runner)."""
    from zephon_testing.servers import dump_digests

    return dump_digests(stream_config[0], 1000)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3-protocol server (moto's standalone server) on loopback for the session."""
    from tests.support.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()
