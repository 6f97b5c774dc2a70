"""Latency statistics and the compiled-vs-eager parity report."""

from __future__ import annotations

import math
import random

import pytest

from neuron.latency import LatencyStats, format_latency_table, percentile
from neuron.parity import ParityReport, compare_logits, worst_of


def test_percentile_interpolates_like_numpy() -> None:
    samples = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 50) == 3.0
    assert percentile(samples, 100) == 10.0
    assert percentile(samples, 90) == pytest.approx(7.6)  # numpy.percentile(..., 90)
    assert percentile(samples, 99) == pytest.approx(9.76)
    assert percentile([5.0], 99) == 5.0


def test_percentile_does_not_depend_on_order() -> None:
    values = [random.Random(7).uniform(0, 100) for _ in range(101)]
    shuffled = random.Random(8).sample(values, len(values))
    assert percentile(values, 99) == percentile(shuffled, 99) == sorted(values)[99]


@pytest.mark.parametrize(("samples", "q"), [([], 50), ([1.0], -1), ([1.0], 101),
                                            ([1.0, math.nan], 50)])
def test_percentile_refuses_bad_input(samples: list[float], q: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        percentile(samples, q)


def test_latency_stats_summarize_and_round_trip() -> None:
    stats = LatencyStats.from_samples_ms([4.0, 2.0, 3.0, 1.0, 100.0], batch_size=4)
    assert (stats.p50_ms, stats.min_ms, stats.max_ms, stats.iterations) == (3.0, 1.0, 100.0, 5)
    assert stats.mean_ms == 22.0
    assert stats.p50_per_text_ms == 0.75
    assert LatencyStats.from_dict(stats.to_dict()).to_dict() == stats.to_dict()
    assert LatencyStats.from_dict(stats.to_dict()).p90_ms == pytest.approx(stats.p90_ms)
    table = format_latency_table([stats])
    assert "p99 ms" in table
    assert "    4     5" in table


@pytest.mark.parametrize(("field", "value"), [("p50_ms", "fast"), ("batch_size", 0),
                                              ("iterations", 2.5), ("p99_ms", -1.0),
                                              ("max_ms", True)])
def test_latency_from_dict_names_the_bad_field(field: str, value: object) -> None:
    data = LatencyStats.from_samples_ms([1.0, 2.0], batch_size=1).to_dict()
    data[field] = value
    with pytest.raises(ValueError, match=f"latency.{field}|batch_size and iterations"):
        LatencyStats.from_dict(data)


def test_identical_logits_have_zero_difference() -> None:
    rows = [[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]]
    report = compare_logits(rows, [list(r) for r in rows], bound=1e-6)
    assert report.passed
    assert report.max_abs_logit_diff == 0.0
    assert report.top1_disagreements == 0
    assert report.smallest_disagreeing_margin is None
    assert "within bound" in report.describe()


def test_difference_over_the_bound_fails_and_flips_are_counted_with_margin() -> None:
    reference = [[1.0, 0.9, 0.0], [5.0, 0.0, 0.0]]
    candidate = [[0.8, 0.95, 0.0], [5.01, 0.0, 0.0]]  # row 0 flips: eager margin 0.1
    report = compare_logits(reference, candidate, bound=0.05)
    assert not report.passed
    assert report.max_abs_logit_diff == pytest.approx(0.2)
    assert report.top1_disagreements == 1
    assert report.smallest_disagreeing_margin == pytest.approx(0.1)
    assert "OVER bound" in report.describe()
    assert "1 top-1 flip" in report.describe()
    assert ParityReport.from_dict(report.to_dict()) == report
    assert report.to_dict()["passed"] is False


def test_non_finite_logits_always_fail() -> None:
    report = compare_logits([[1.0, 2.0]], [[1.0, math.nan]], bound=1e9)
    assert not report.passed
    assert math.isinf(report.max_abs_logit_diff)


@pytest.mark.parametrize(("reference", "candidate", "bound", "message"), [
    ([], [], 0.1, "no rows"),
    ([[1.0]], [[1.0], [2.0]], 0.1, "rows"),
    ([[1.0, 2.0]], [[1.0]], 0.1, "row 0"),
    ([[1.0]], [[1.0]], 0.0, "bound"),
])
def test_compare_logits_refuses_mismatched_input(reference: list[list[float]],
                                                 candidate: list[list[float]], bound: float,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compare_logits(reference, candidate, bound=bound)


def test_worst_of_keeps_the_largest_difference() -> None:
    small = compare_logits([[1.0, 0.0]], [[1.001, 0.0]], bound=0.01)
    large = compare_logits([[1.0, 0.0]], [[1.009, 0.0]], bound=0.01)
    assert worst_of([small, large]).max_abs_logit_diff == large.max_abs_logit_diff
    with pytest.raises(ValueError, match="no reports"):
        worst_of([])
