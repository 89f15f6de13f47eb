"""What a measured phase changed in the controller's and the API server's /metrics.

Owns: `scrape_metrics` (the controller's /metrics plus kube-apiserver's request counters, one list),
`metric_deltas` (reconciles, controller requests, API server writes and their latency, controller internals
between two scrapes) and `wait_quiescent` (until the controller's reconcile counters stop moving).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agent_sandbox.kube import KubeError

from . import promtext
from .cluster import Bench
from .stats import counter_delta, diff_buckets, histogram_quantile

__all__ = ["metric_deltas", "scrape_metrics", "wait_quiescent"]


async def scrape_metrics(bench: Bench) -> list[promtext.Sample]:
    """The controller's /metrics plus the kube-apiserver's request counters (one list)."""
    try:
        samples = await bench.scrape()
    except OSError as exc:
        bench.notes.append(f"metrics scrape failed: {exc}")
        samples = []
    try:
        keep = (
            "apiserver_request_total",
            "apiserver_request_duration_seconds_sum",
            "apiserver_request_duration_seconds_count",
        )
        samples += [s for s in await bench.scrape_apiserver() if s.name in keep]
    except KubeError as exc:
        bench.notes.append(f"apiserver metrics scrape failed: {exc}")
    return samples


def _apiserver_writes(before: list[promtext.Sample], after: list[promtext.Sample]) -> dict[str, float]:
    """Mutating requests the API server served (all clients), by "VERB resource[/subresource]"."""

    def writes(samples: list[promtext.Sample]) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in samples:
            if s.name == "apiserver_request_total" and s.labels.get("verb") in (
                "POST",
                "PATCH",
                "PUT",
                "DELETE",
                "APPLY",
            ):
                sub = s.labels.get("subresource", "")
                key = f"{s.labels['verb']} {s.labels.get('resource', '')}{'/' + sub if sub else ''}"
                out[key] = out.get(key, 0.0) + s.value
        return out

    return counter_delta(writes(after), writes(before))


def _apiserver_latency(before: list[promtext.Sample], after: list[promtext.Sample]) -> dict[str, float]:
    """Mean server-side latency (ms) of mutating requests by verb, all clients (sum/count deltas)."""

    def totals(samples: list[promtext.Sample], suffix: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in samples:
            verb = s.labels.get("verb", "")
            if s.name == f"apiserver_request_duration_seconds_{suffix}" and verb in (
                "POST",
                "PATCH",
                "PUT",
                "DELETE",
            ):
                out[verb] = out.get(verb, 0.0) + s.value
        return out

    sums = counter_delta(totals(after, "sum"), totals(before, "sum"))
    counts = counter_delta(totals(after, "count"), totals(before, "count"))
    return {verb: round(1000 * sums.get(verb, 0.0) / n, 1) for verb, n in counts.items() if n > 0}


def metric_deltas(before: list[promtext.Sample], after: list[promtext.Sample]) -> dict[str, Any]:
    """What changed between two scrapes: reconciles, requests, API server writes, controller internals."""
    reconciles = counter_delta(
        promtext.counter_by(after, "controller_runtime_reconcile_total", "controller"),
        promtext.counter_by(before, "controller_runtime_reconcile_total", "controller"),
    )
    requests = counter_delta(
        promtext.counter_by(after, "rest_client_requests_total", "method"),
        promtext.counter_by(before, "rest_client_requests_total", "method"),
    )
    return {
        "reconciles": reconciles,
        "controller_requests": requests,
        "apiserver_writes": _apiserver_writes(before, after),
        "apiserver_latency_ms": _apiserver_latency(before, after),
        "controller_internals_ms": {
            "rest_patch": _hist_stats(before, after, "rest_client_request_duration_seconds", verb="PATCH"),
            "rest_post": _hist_stats(before, after, "rest_client_request_duration_seconds", verb="POST"),
            "claim_queue_wait": _hist_stats(
                before, after, "workqueue_queue_duration_seconds", name="sandboxclaim"
            ),
            "claim_reconcile": _hist_stats(
                before, after, "controller_runtime_reconcile_time_seconds", controller="sandboxclaim"
            ),
            "sandbox_queue_wait": _hist_stats(
                before, after, "workqueue_queue_duration_seconds", name="sandbox"
            ),
        },
    }


def _hist_stats(
    before: list[promtext.Sample], after: list[promtext.Sample], metric: str, **labels: str
) -> dict[str, Any]:
    """Exact mean (from _sum/_count) and bucket-interpolated P50/P99 of a seconds histogram, in ms."""
    buckets = diff_buckets(
        promtext.histogram(after, metric, **labels), promtext.histogram(before, metric, **labels)
    )
    count = (promtext.scalar(after, f"{metric}_count", **labels) or 0.0) - (
        promtext.scalar(before, f"{metric}_count", **labels) or 0.0
    )
    total = (promtext.scalar(after, f"{metric}_sum", **labels) or 0.0) - (
        promtext.scalar(before, f"{metric}_sum", **labels) or 0.0
    )
    if count <= 0 or not buckets:
        return {"count": 0}
    p50, p99 = histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
    return {
        "count": int(count),
        "mean": round(1000 * total / count, 1),
        "p50": None if p50 is None else round(1000 * p50, 1),
        "p99": None if p99 is None else round(1000 * p99, 1),
    }


async def wait_quiescent(bench: Bench, *, within: float, still_s: float = 5.0) -> float:
    """Seconds until the controller's reconcile counters stop moving for `still_s` (bounded)."""
    t0 = time.monotonic()
    last: dict[str, float] | None = None
    since = time.monotonic()
    while time.monotonic() - t0 < within:
        now = promtext.counter_by(
            await scrape_metrics(bench), "controller_runtime_reconcile_total", "controller"
        )
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return time.monotonic() - t0 - still_s
        await asyncio.sleep(1.0)
    return time.monotonic() - t0
