"""A trainer client whose server is restarted on the same address: same pipeline or stop.

Real ``zephon serve`` subprocesses on one fixed loopback port: a DataClient reads some
batches, the server is stopped (SIGTERM) and another one started on the same port. With
another pipeline (another seed) the client must raise ``PipelineMismatch`` instead of
yielding that pipeline's batches, with ``verify`` on or off; with the same pipeline it
continues seamlessly. Every batch yielded must be the first pipeline's batch at that
``(lane, seq)``.
"""

from __future__ import annotations

import pytest

from zephon_testing.scenarios.client_identity import (
    make_pipelines,
    run_swap_to_another_pipeline,
    run_swap_to_the_same_pipeline,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory, corpus_dir):
    return make_pipelines(tmp_path_factory.mktemp("identity"), corpus_dir)


@pytest.mark.parametrize("verify", [False, True])
def test_a_server_restarted_with_another_pipeline_stops_the_client(pipelines, verify):
    run_swap_to_another_pipeline(pipelines, verify)


def test_a_server_restarted_with_the_same_pipeline_continues_seamlessly(pipelines):
    run_swap_to_the_same_pipeline(pipelines)
