"""Pure statistics of the benchmark harness: exact percentiles, Prometheus-style histogram quantiles,
time windows and rate series. No I/O, no clock; unit-tested in tests/unit/benchmarks/.

Two ways to read a latency distribution, both reported:

* `percentile` / `summarize`: exact order statistics of the samples (linear interpolation between the two
  closest ranks, numpy's default "linear" method), used for the client-side create -> Ready latencies.
* `histogram_quantile`: what the upstream KWOK gate (ClusterLoader2) and PromQL compute from the
  controller's `agent_sandbox_claim_controller_startup_latency_ms` buckets: find the bucket holding the
  rank and interpolate linearly inside it. With buckets 100/250/500 ms a true P99 of 120 ms reads as
  ~248 ms, so the gate's number is an upper-bucket-biased estimate, never an exact one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "Buckets",
    "diff_buckets",
    "histogram_quantile",
    "histogram_summary",
    "percentile",
    "rate_series",
    "summarize",
    "windows",
]

Buckets = list[tuple[float, float]]
"""Cumulative histogram buckets: (upper bound `le`, cumulative count), sorted, ending with +Inf."""


def percentile(values: Sequence[float], q: float) -> float:
    """Exact q-th percentile (0..100) of `values`, linear interpolation between closest ranks.

    Raises:
        ValueError: no values, or q outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def summarize(values: Sequence[float], *, digits: int = 1) -> dict[str, float | int | None]:
    """count, min, mean, p50, p90, p99, max of `values` (None entries when there are none)."""
    if not values:
        return {"count": 0, "min": None, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(values),
        "min": round(min(values), digits),
        "mean": round(sum(values) / len(values), digits),
        "p50": round(percentile(values, 50), digits),
        "p90": round(percentile(values, 90), digits),
        "p99": round(percentile(values, 99), digits),
        "max": round(max(values), digits),
    }


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """PromQL `histogram_quantile(q, ...)` over cumulative `buckets` (q in 0..1).

    Returns None when the histogram is empty. A rank that falls into the +Inf bucket returns the largest
    finite upper bound (Prometheus does the same).

    Raises:
        ValueError: q outside [0, 1], or no +Inf bucket.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        raise ValueError("histogram needs a +Inf bucket")
    total = ordered[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le  # unreachable with a monotone histogram; keeps the type checker content


def diff_buckets(after: Sequence[tuple[float, float]], before: Sequence[tuple[float, float]]) -> Buckets:
    """`after - before` bucket by bucket (the samples observed between two scrapes)."""
    prior = dict(before)
    return [(le, count - prior.get(le, 0.0)) for le, count in sorted(after)]


def histogram_summary(buckets: Sequence[tuple[float, float]]) -> dict[str, float | int | None]:
    """count and the gate's P50/P90/P99 of a cumulative histogram."""
    ordered = sorted(buckets)
    count = int(ordered[-1][1]) if ordered else 0

    def q(x: float) -> float | None:
        if not ordered:
            return None
        value = histogram_quantile(x, ordered)
        return None if value is None else round(value, 1)

    return {"count": count, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def windows(
    samples: Iterable[tuple[float, float]], *, width: float = 10.0, start: float = 0.0
) -> list[dict[str, float | int | None]]:
    """Tumbling windows of (time, latency) samples: per window its start, count, p50/p90/p99.

    Empty windows between the first and last sample are kept (count 0) so a plot shows gaps.
    """
    if width <= 0:
        raise ValueError("window width must be > 0")
    buckets: dict[int, list[float]] = {}
    for t, value in samples:
        buckets.setdefault(math.floor((t - start) / width), []).append(value)
    if not buckets:
        return []
    out: list[dict[str, float | int | None]] = []
    for i in range(min(buckets), max(buckets) + 1):
        vals = buckets.get(i, [])
        stats = summarize(vals)
        out.append(
            {
                "t": round(start + i * width, 3),
                "count": len(vals),
                "p50": stats["p50"],
                "p90": stats["p90"],
                "p99": stats["p99"],
            }
        )
    return out


def rate_series(
    times: Iterable[float], *, width: float = 1.0, start: float = 0.0
) -> list[tuple[float, float]]:
    """Events per second in consecutive bins of `width` seconds: [(bin start, rate)], gaps as 0."""
    if width <= 0:
        raise ValueError("bin width must be > 0")
    counts: dict[int, int] = {}
    for t in times:
        i = math.floor((t - start) / width)
        counts[i] = counts.get(i, 0) + 1
    if not counts:
        return []
    return [
        (round(start + i * width, 3), counts.get(i, 0) / width) for i in range(min(counts), max(counts) + 1)
    ]


def peak_rate(series: Sequence[tuple[float, float]], *, span: int = 1) -> float:
    """Highest average rate over `span` consecutive bins of a `rate_series` (0 when empty)."""
    if not series:
        return 0.0
    rates = [r for _, r in series]
    span = max(1, min(span, len(rates)))
    return max(sum(rates[i : i + span]) / span for i in range(len(rates) - span + 1))


def counter_delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """Per-key difference of two counter snapshots (keys only in `after` count from 0)."""
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after) if after[k] - before.get(k, 0.0)}
