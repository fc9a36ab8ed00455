"""A processes-runner server killed with SIGKILL leaves nothing behind (issue 19, item 10).

Real ``zephon serve --runner processes --workers 2`` subprocesses, real signals, the real
``/dev/shm``. Before a kill each test records the server's process tree (pid and start time,
so a reused pid is not mistaken for a survivor) and the ``/dev/shm`` entries attributable to
it: those its processes have mapped (``/proc/<pid>/maps``: semaphores, attached blocks) and
those named after its owner id (payload blocks, the owner file). Other programs on the host
may own entries too; only these are asserted on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon_testing.scenarios.crash_cleanup import (
    run_sigkill_of_the_server,
    run_sweep_of_a_killed_tree,
)
from zephon_testing.servers import (
    write_config,
)

pytestmark = [pytest.mark.service, pytest.mark.processes]


@pytest.fixture(scope="module")
def endless_config(tmp_path_factory, corpus_dir) -> Path:
    """The service pipeline over an endless corpus: lane 0 can be read for as long as a test
    needs to catch the server holding payload blocks."""
    work = tmp_path_factory.mktemp("cleanup")
    return write_config(work / "pipeline.yaml", corpus_dir, exhaustion="repeat")


@pytest.mark.timeout(150)
def test_sigkill_of_the_server_ends_its_workers_and_tracker_and_frees_shared_memory(
    endless_config, tmp_path
):
    run_sigkill_of_the_server(endless_config, tmp_path)


@pytest.mark.timeout(180)
def test_start_up_sweeps_a_killed_tree_and_spares_a_live_server(endless_config, tmp_path):
    run_sweep_of_a_killed_tree(endless_config, tmp_path)
