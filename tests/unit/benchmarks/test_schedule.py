"""Arrival schedules: seeded Poisson (reproducible), uniform pacing, round robin, pool sizing."""

from __future__ import annotations

import itertools
import statistics

import pytest
from benchmarks.schedule import poisson_arrivals, pool_replicas, round_robin, uniform_arrivals

pytestmark = pytest.mark.unit


def test_poisson_is_reproducible_per_seed() -> None:
    a = poisson_arrivals(45.0, 60.0, seed=7)
    assert a == poisson_arrivals(45.0, 60.0, seed=7)
    assert a != poisson_arrivals(45.0, 60.0, seed=8)


def test_poisson_shape() -> None:
    arrivals = poisson_arrivals(100.0, 200.0, seed=1)
    assert arrivals == sorted(arrivals)
    assert all(0.0 < t < 200.0 for t in arrivals)
    # 20,000 expected; a Poisson count has sd sqrt(20000) ~ 141.
    assert abs(len(arrivals) - 20_000) < 5 * 141
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Exponential gaps: mean 1/rate and coefficient of variation ~1.
    assert statistics.fmean(gaps) == pytest.approx(0.01, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize(("rate", "duration"), [(0.0, 10.0), (10.0, 0.0), (-1.0, 5.0)])
def test_empty_schedules(rate: float, duration: float) -> None:
    assert poisson_arrivals(rate, duration, seed=1) == []
    assert uniform_arrivals(rate, duration) == []


def test_uniform_pacing_like_cl2_qps() -> None:
    arrivals = uniform_arrivals(75.0, 10.0)
    assert len(arrivals) == 750
    assert arrivals[0] == 0.0
    assert arrivals[1] == pytest.approx(1 / 75)
    assert arrivals[-1] == pytest.approx(749 / 75)


def test_round_robin() -> None:
    assert round_robin(5, ["a", "b"]) == ["a", "b", "a", "b", "a"]
    with pytest.raises(ValueError, match="target"):
        round_robin(3, [])


@pytest.mark.parametrize(
    ("rate", "pools", "headroom", "minimum", "want"),
    [(45.0, 4, 10.0, 1, 113), (300.0, 4, 10.0, 1, 750), (1.0, 4, 10.0, 20, 20), (75.0, 1, 14.0, 1, 1050)],
)
def test_pool_replicas(rate: float, pools: int, headroom: float, minimum: int, want: int) -> None:
    assert pool_replicas(rate, pools, headroom, minimum=minimum) == want
