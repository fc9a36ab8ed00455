"""Memory bound on a real server: ``--max-ahead`` bounds what a lane buffers, in batches and
in bytes, whatever the documents and whether anyone reads.

A lane's log holds at most ``--max-ahead + headroom`` unconsumed batches (8 + 8 here): one
20 MB document packs into 20,480 batches, yet a stream that never acknowledges holds the
server at 16 and its memory flat; with no stream at all no lane passes 16 either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon_testing.scenarios.memory_bound import (
    make_huge_config,
    run_never_acking,
    run_no_consumer,
)

pytestmark = pytest.mark.service

DOC_MB = 20


@pytest.fixture(scope="module")
def huge_config(tmp_path_factory) -> Path:
    """Two lanes over one dataset holding one 20 MB document (and nothing else)."""
    return make_huge_config(tmp_path_factory.mktemp("huge-doc"), DOC_MB)


@pytest.mark.timeout(180)
def test_a_stream_that_never_acks_holds_a_huge_document_at_the_bound(huge_config, tmp_path):
    figures = run_never_acking(huge_config, tmp_path)
    assert figures["rss_mb"] < 400, figures  # 20,480 batches of 4 x 256 tokens: ~800 MB


@pytest.mark.timeout(120)
def test_without_any_consumer_every_lane_stays_within_the_bound(corpus_dir, tmp_path):
    """A repeating corpus whose 64-document chunks pack into hundreds of batches each: with
    nobody reading for a few seconds no lane holds more than the bound (the run waits)."""
    run_no_consumer(corpus_dir, tmp_path)
