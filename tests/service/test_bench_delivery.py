"""The delivery-cost benchmark (bench/delivery.py) on a small real pipeline, and its table: the
tests that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_bench_delivery.py``.
"""

from __future__ import annotations

import pytest

from bench.delivery import measure
from bench.workload import write_config
from tests.unit.test_bench_delivery import PARTS

pytestmark = pytest.mark.timeout(240)


def test_every_part_of_delivering_a_batch_is_measured(tmp_path, corpus_dir):
    config = write_config(
        tmp_path / "pipeline.yaml", corpus_dir, "byte", chunk_size=16, k=2, shuffle_buffer=4
    )
    got = measure(str(config), batches=1, rounds=1, reps=2)
    assert got["lanes"] == 8 and got["batches"] == 8
    # 8 rows x 2048 tokens of int32 ids, positions and segment ids, and a bool mask
    assert got["message_bytes"] > 8 * 2048 * 13
    assert 0 < got["tokens_per_batch"] <= 8 * 2048
    grouped = ["data_client_server_us", "data_client_grouped_us", "data_client_grouped_server_us"]
    keys = [*PARTS, "server_protobuf_us", "data_client_us", "data_client_no_verify_us", *grouped]
    # Each part is measured, from CPU counters of clock-tick resolution (10 ms): in a run this
    # small one of them may read 0 (CI once saw the server's transport at 0), never less.
    assert all(got[key] >= 0 for key in keys), {key: got[key] for key in keys}
    assert sum(got[key] > 0 for key in keys) >= len(keys) // 2, {key: got[key] for key in keys}
    assert got["group"] == 3
