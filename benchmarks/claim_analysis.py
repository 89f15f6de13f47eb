"""A claim phase's latencies, throughput and errors, from the tracker's records and two /metrics scrapes.

Owns: `analyse_claims` (both latency views - the controller's histogram and the client's watch - plus the
exact controller-side one from annotations, create acks, send lag, throughput, 10 s windows and what the
phase changed in /metrics), `process_view` (the separate watcher process's view), `as_ms`, and the names of
the claim-latency histograms (`CLAIM_HIST`, `CLIENT_HIST`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import promtext
from .phase_metrics import metric_deltas
from .stats import diff_buckets, histogram_summary, peak_rate, rate_series, summarize, windows
from .trackers import ClaimTracker

__all__ = ["CLAIM_HIST", "CLIENT_HIST", "analyse_claims", "as_ms", "process_view"]


CLAIM_HIST = "agent_sandbox_claim_controller_startup_latency_ms"
CLIENT_HIST = "agent_sandbox_client_claim_startup_latency_ms"


def as_ms(values: Sequence[float]) -> list[float]:
    """Seconds to milliseconds, rounded to 0.1 ms."""
    return [round(v * 1000.0, 1) for v in values]


def analyse_claims(
    tracker: ClaimTracker,
    t0: float,
    before: list[promtext.Sample],
    after: list[promtext.Sample],
) -> dict[str, Any]:
    """Both latency views (+ the exact controller-side one from annotations), throughput, errors."""
    recs = list(tracker.records.values())
    ready = [r for r in recs if r.ready is not None]
    client = [r.ready - r.sent for r in ready if r.ready is not None]
    ack = [r.acked - r.sent for r in recs if r.acked is not None]
    annotated = [
        r.first_ready - r.first_observed
        for r in recs
        if r.first_ready is not None and r.first_observed is not None
    ]
    observe_delay = [r.first_observed - r.sent for r in recs if r.first_observed is not None]
    lag = [r.sent - r.scheduled for r in recs]
    hist = diff_buckets(promtext.histogram(after, CLAIM_HIST), promtext.histogram(before, CLAIM_HIST))
    client_hist = diff_buckets(
        promtext.histogram(after, CLIENT_HIST), promtext.histogram(before, CLIENT_HIST)
    )
    ready_times = sorted(r.ready - t0 for r in ready if r.ready is not None)
    sent_times = sorted(r.sent - t0 for r in recs)
    series = rate_series(ready_times, width=1.0)
    launch: dict[str, int] = {}
    for r in ready:
        launch[r.launch_type] = launch.get(r.launch_type, 0) + 1
    span = (ready_times[-1] - sent_times[0]) if ready_times and sent_times else 0.0
    return {
        "claims": len(recs),
        "ready": len(ready),
        "create_errors": sum(1 for r in recs if r.error),
        "first_errors": sorted({r.error for r in recs if r.error})[:3],
        "launch_types": launch,
        "latency_ms": {
            "controller_histogram": histogram_summary(hist) if hist else {"count": 0},
            "client_watch": summarize(as_ms(client)),
            "controller_annotations": summarize(as_ms(annotated)),
            "create_ack": summarize(as_ms(ack)),
            "create_to_first_observed": summarize(as_ms(observe_delay)),
            "client_annotation_histogram": histogram_summary(client_hist) if client_hist else {"count": 0},
        },
        "send_lag_ms": summarize(as_ms(lag)),
        "max_inflight_creates": tracker.max_inflight,
        "throughput": {
            "offered_per_s": round(len(recs) / max(sent_times[-1], 1e-9), 1) if len(sent_times) > 1 else None,
            "ready_per_s_mean": round(len(ready) / span, 1) if span > 0 else None,
            "ready_per_s_peak_1s": round(peak_rate(series, span=1), 1),
            "ready_per_s_peak_5s": round(peak_rate(series, span=5), 1),
            "all_ready_after_s": round(ready_times[-1], 3) if ready_times else None,
        },
        "windows_10s": windows(
            ((r.sent - t0, (r.ready - r.sent) * 1000.0) for r in ready if r.ready is not None), width=10.0
        ),
        "series": {
            "ready_per_s": series,
            "sent_per_s": rate_series(sent_times, width=1.0),
        },
        "samples_ms": {
            "client_watch": sorted(as_ms(client)),
            "controller_annotations": sorted(as_ms(annotated)),
        },
        **metric_deltas(before, after),
    }


def process_view(tracker: ClaimTracker, seen: Mapping[str, tuple[float, float | None]]) -> list[float]:
    """Create sent -> Ready seen by the separate watcher process (`client_watch`), in seconds."""
    out = []
    for key, rec in tracker.records.items():
        ready, requested = seen.get(key, (None, None))
        if ready is not None:
            out.append(ready - (requested if requested is not None else rec.sent))
    return out
