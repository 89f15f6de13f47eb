"""Pure parts of the benchmark harness: percentiles, histogram quantiles, windows, rates."""

from __future__ import annotations

import math
import statistics

import pytest
from benchmarks.stats import (
    counter_delta,
    diff_buckets,
    histogram_quantile,
    histogram_summary,
    peak_rate,
    percentile,
    rate_series,
    summarize,
    windows,
)

pytestmark = pytest.mark.unit

INF = math.inf


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        ([5.0], 0, 5.0),
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),  # order does not matter
        (list(range(1, 101)), 99, 99.01),
        (list(range(1, 101)), 90, 90.1),
    ],
)
def test_percentile_linear_between_closest_ranks(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == pytest.approx(want)


def test_percentile_matches_statistics_inclusive_method() -> None:
    values = [3.1, 7.4, 0.2, 9.9, 5.5, 1.0, 8.8, 2.2, 6.6, 4.4, 12.0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for q in (10, 50, 90, 99):
        assert percentile(values, q) == pytest.approx(cuts[q - 1])


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_rejects_bad_input(values: list[float], q: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        percentile(values, q)


def test_summarize() -> None:
    out = summarize([10.0, 20.0, 30.0, 40.0, 50.0])
    assert out == {"count": 5, "min": 10.0, "mean": 30.0, "p50": 30.0, "p90": 46.0, "p99": 49.6, "max": 50.0}
    assert summarize([])["count"] == 0
    assert summarize([])["p99"] is None


# Prometheus semantics: cumulative buckets, linear interpolation inside the bucket holding the rank.
CLAIM = [(100.0, 0.0), (250.0, 0.0), (500.0, 0.0)]


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(100.0, 50.0), (250.0, 90.0), (500.0, 100.0), (INF, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(100.0)
    assert histogram_quantile(0.25, buckets) == pytest.approx(50.0)  # first bucket starts at 0
    assert histogram_quantile(0.7, buckets) == pytest.approx(175.0)
    assert histogram_quantile(0.99, buckets) == pytest.approx(475.0)


def test_histogram_quantile_bucket_bias_of_the_gate() -> None:
    # 100 samples all at 120 ms: the exact P99 is 120, the gate's interpolation reads 248.5.
    buckets = [(100.0, 0.0), (250.0, 100.0), (500.0, 100.0), (INF, 100.0)]
    assert histogram_quantile(0.99, buckets) == pytest.approx(248.5)


def test_histogram_quantile_inf_bucket_returns_largest_finite_bound() -> None:
    buckets = [(100.0, 1.0), (250.0, 2.0), (INF, 10.0)]
    assert histogram_quantile(0.99, buckets) == 250.0


def test_histogram_quantile_empty_and_errors() -> None:
    assert histogram_quantile(0.5, [(100.0, 0.0), (INF, 0.0)]) is None
    with pytest.raises(ValueError, match="Inf"):
        histogram_quantile(0.5, [(100.0, 1.0)])
    with pytest.raises(ValueError, match="quantile"):
        histogram_quantile(1.5, [(INF, 1.0)])


def test_diff_buckets_and_summary() -> None:
    before = [(100.0, 5.0), (250.0, 5.0), (INF, 5.0)]
    after = [(100.0, 15.0), (250.0, 25.0), (INF, 25.0)]
    diff = diff_buckets(after, before)
    assert diff == [(100.0, 10.0), (250.0, 20.0), (INF, 20.0)]
    assert histogram_summary(diff) == {"count": 20, "p50": 100.0, "p90": 220.0, "p99": 247.0}
    # A label set that appeared only after the first scrape counts from zero.
    assert diff_buckets([(INF, 3.0)], []) == [(INF, 3.0)]


def test_windows_tumbling_with_gaps() -> None:
    samples = [(0.5, 10.0), (1.0, 20.0), (25.0, 30.0)]
    out = windows(samples, width=10.0)
    assert [w["t"] for w in out] == [0.0, 10.0, 20.0]
    assert [w["count"] for w in out] == [2, 0, 1]
    assert out[0]["p50"] == 15.0
    assert out[1]["p99"] is None
    assert windows([], width=10.0) == []
    with pytest.raises(ValueError, match="width"):
        windows(samples, width=0)


def test_rate_series_and_peak() -> None:
    series = rate_series([0.1, 0.2, 0.9, 2.5, 2.6], width=1.0)
    assert series == [(0.0, 3.0), (1.0, 0.0), (2.0, 2.0)]
    assert peak_rate(series) == 3.0
    assert peak_rate(series, span=2) == 1.5
    assert peak_rate([]) == 0.0
    assert rate_series([0.0, 0.25], width=0.5) == [(0.0, 4.0)]


def test_counter_delta() -> None:
    assert counter_delta({"PATCH": 10.0, "POST": 3.0, "GET": 1.0}, {"PATCH": 4.0, "GET": 1.0}) == {
        "PATCH": 6.0,
        "POST": 3.0,
    }
