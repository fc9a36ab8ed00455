"""Counters of this process's work keep counting across a Resume (a new run in the hub)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily

from zephon_server.service.metric_carry import Carry


def skipped(values: dict[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily("zephon_records_skipped", "skipped", labels=["dataset"])
    for dataset, n in values.items():
        family.add_metric([dataset], n)
    return family


def exported(carry: Carry, generation: int, values: dict[str, float]) -> dict[str, float]:
    [family] = list(carry.apply(generation, [skipped(values)]))
    return {s.labels["dataset"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_a_new_run_adds_to_what_the_earlier_runs_counted():
    carry = Carry()
    assert exported(carry, 1, {"web": 3.0}) == {"web": 3.0}
    assert exported(carry, 1, {"web": 5.0, "code": 1.0}) == {"web": 5.0, "code": 1.0}
    # a Resume: the new run counts from 0, and has not met a bad record of 'code' yet
    assert exported(carry, 2, {"web": 2.0}) == {"web": 7.0, "code": 1.0}
    assert exported(carry, 3, {}) == {"web": 7.0, "code": 1.0}  # a run with none at all
    assert exported(carry, 3, {"code": 4.0}) == {"web": 7.0, "code": 5.0}


def test_other_families_pass_unchanged():
    carry = Carry()
    produced = CounterMetricFamily("zephon_lane_batches_produced", "position", labels=["lane"])
    produced.add_metric(["0"], 109)
    list(carry.apply(1, [produced]))
    again = CounterMetricFamily("zephon_lane_batches_produced", "position", labels=["lane"])
    again.add_metric(["0"], 59)  # a position: resumed at an earlier checkpoint
    [family] = list(carry.apply(2, [again]))
    assert [s.value for s in family.samples] == [59]
