"""The benchmark's round design: the two sides of every target ratio run back to back, and a
ratio is the median of its per-round values (bench/run.py, bench/cases.py)."""

from __future__ import annotations

from bench.cases import RATIOS, THROUGHPUT_CASES
from bench.run import _ratio_row, median_round, round_order, round_ratios


def test_every_target_ratio_runs_its_two_sides_back_to_back():
    for reverse in (False, True):
        order = [c.key for c in round_order(THROUGHPUT_CASES, reverse)]
        assert sorted(order) == sorted(c.key for c in THROUGHPUT_CASES)
        for ratio in RATIOS:
            if ratio.target is None or ratio.numerator not in order:
                continue
            gap = abs(order.index(ratio.numerator) - order.index(ratio.denominator))
            assert gap == 1, f"{ratio.key}: {ratio.numerator} and {ratio.denominator} apart"


def test_alternate_rounds_run_in_reverse():
    forward = round_order(THROUGHPUT_CASES, False)
    assert round_order(THROUGHPUT_CASES, True) == forward[::-1]


def test_ratio_is_the_median_of_the_rounds_not_best_over_best():
    # Round 2 ran on a fast machine for the numerator only; best/best would say 1.5.
    num = [{"rate": 90.0}, {"rate": 150.0}, {"rate": 80.0}]
    den = [{"rate": 100.0}, {"rate": 100.0}, {"rate": 100.0}]
    assert round_ratios(num, den, "rate") == [0.9, 1.5, 0.8]
    target = next(r for r in RATIOS if r.key == "service_vs_tokenizer")
    row = _ratio_row(target, {target.numerator: num, target.denominator: den}, steady_valid=False)
    assert row["value"] == 0.9
    assert row["round"] == 0
    assert row["rounds"] == [0.9, 1.5, 0.8]
    assert row["ok"] is True  # 0.9 meets ">= 0.90"


def test_rounds_missing_a_side_are_left_out():
    assert round_ratios([{"rate": 1.0}, {}], [{"rate": 2.0}, {"rate": 2.0}], "rate") == [0.5, None]
    assert median_round([None, 0.8, 0.9, 1.0]) == 2
    assert median_round([None]) is None


def test_the_bench_runs_on_a_preloaded_allocator_or_the_one_the_server_picks(monkeypatch):
    from bench.cases import bench_allocator
    from zephon_server.runtime import allocator

    # Without mimalloc in a standard directory the server asks `ldconfig -p` (a subprocess);
    # which library the cache names is not this test's question.
    monkeypatch.setattr(allocator, "_ldconfig_paths", dict)
    preloaded = "/opt/x/libjemalloc.so.2"
    assert bench_allocator({"LD_PRELOAD": f"/opt/libfoo.so:{preloaded}"}) == preloaded
    picked = allocator.resolve("auto", {}).library
    assert bench_allocator({"LD_PRELOAD": "/opt/libfoo.so"}) == picked
    assert bench_allocator({}) == picked
