"""LeaseWatch.summary: renewals inside the window and the largest gap a rival candidate would see."""

from __future__ import annotations

from typing import Any, cast

from benchmarks.overload import LeaseWatch


def _watch(renewals: list[float], holders: list[str]) -> LeaseWatch:
    return LeaseWatch(api=cast(Any, None), renewals=renewals, holders=holders)


def test_gap_counts_the_window_edges() -> None:
    out = _watch([8.0, 12.0, 14.0, 30.0], ["a"]).summary(10.0, 25.0)
    assert out["renewals"] == 2  # 8 and 30 are outside
    assert out["max_gap_s"] == 11.0  # last renewal at 14, window ends at 25
    assert out["holder_changes"] == 0


def test_no_renewal_at_all_is_the_whole_window_and_a_new_holder_is_counted() -> None:
    out = _watch([], ["a", "b"]).summary(0.0, 60.0)
    assert out["renewals"] == 0
    assert out["max_gap_s"] == 60.0
    assert out["holder_changes"] == 1
