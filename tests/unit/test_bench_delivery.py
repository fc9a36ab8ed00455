"""The delivery-cost benchmark (bench/delivery.py) on a small real pipeline, and its table."""

from __future__ import annotations

import pytest

from bench import report

pytestmark = pytest.mark.timeout(240)

PARTS = [key for _, _, key in report.DELIVERY_PARTS]


def results_with(delivery: dict[str, float], engine_cpu_per_mtok: float) -> dict:
    run = {"tokens": 1_000_000, "cpu_main": engine_cpu_per_mtok, "cpu_children": 0.0}
    return {"runs": {"engine_threads_2": [run, run, run]}, "delivery": delivery}


def test_delivery_table_states_each_part_against_the_engines_cpu_per_batch():
    delivery = {key: 100.0 for key in PARTS}
    delivery.update(tokens_per_batch=10_000, data_client_us=300.0, data_client_no_verify_us=200.0)
    # 2 CPU s per million tokens: 20 ms per batch of 10k tokens
    results = results_with(delivery, 2.0)
    assert report.engine_us_per_batch(results) == pytest.approx(20_000)
    total, transport, engine = report.delivery_parts(results)
    assert (total, transport, engine) == (500.0, 200.0, pytest.approx(20_000))
    text = report.delivery_table(results)
    assert "| **sum of the parts** | **500** | **2.5%** |" in text
    assert "protobuf" not in text
    delivery["server_protobuf_us"] = 160.0
    assert "(unused) | 160 | 0.8% |" in report.delivery_table(results)
    assert "| 100 | 0.5% |" in text and "| 300 | 1.5% |" in text
    assert report.delivery_table({"runs": {}, "delivery": None}) == ""
    delivery.update(
        group=3,
        data_client_server_us=240.0,
        data_client_grouped_us=180.0,
        data_client_grouped_server_us=120.0,
    )
    text = report.delivery_table(results)
    assert "| server | the same, 3 batches per message (`BatchGroup`) | 120 | 0.6% |" in text
    assert "| client | the real DataClient, whole, 3 batches per message | 180 | 0.9% |" in text


def test_results_from_before_hand_encoding_still_render():
    legacy = [key for _, _, key in report.LEGACY_SERVER_PARTS]
    delivery = {key: 100.0 for key in [*legacy, *PARTS[1:]]}
    delivery.update(tokens_per_batch=10_000, data_client_us=300.0, data_client_no_verify_us=200.0)
    text = report.delivery_table(results_with(delivery, 2.0))
    assert "serialize it for gRPC | 100" in text and "**700**" in text
    assert "encode the message bytes" not in text


def test_the_report_names_the_allocator_every_row_ran_with():
    line = report.allocator_line({"allocator": "/usr/lib/libmimalloc.so.2"})
    assert "`/usr/lib/libmimalloc.so.2` preloaded" in line and "glibc malloc run without" in line
    assert "glibc malloc in every row" in report.allocator_line({"allocator": None})
    assert "glibc malloc in every row" in report.allocator_line({})
