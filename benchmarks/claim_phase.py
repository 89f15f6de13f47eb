"""One measured claim phase: open-loop creates against warm pools, every claim watched to Ready, analysed.

Owns: `claim_phase` (wait for quiet, an idle baseline, a /metrics scrape, optional profiles of the controller
and the API server, `arrivals` fired open-loop, every claim waited to Ready, a second scrape, the analysis)
and `create_pools` (the namespaces, templates and warm pools a phase draws from). The burst, sustained and
overload scenarios are built from these.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import apiserver_profile
from .claim_analysis import analyse_claims, as_ms, process_view
from .client_watch import ClientWatchProcess
from .cluster import Bench
from .controller_profile import finish_profiler, profile_path_for, profile_summary_for
from .phase_metrics import scrape_metrics, wait_quiescent
from .result_files import RESULTS
from .scenario_params import Params
from .stats import summarize
from .trackers import ClaimTracker

__all__ = ["claim_phase", "create_pools"]


async def claim_phase(
    bench: Bench,
    *,
    arrivals: Sequence[float],
    targets: Sequence[tuple[str, str]],
    prefix: str,
    dwell: float | None,
    ready_timeout: float,
    profile_label: str | None = None,
    controller_profile: bool = True,
    baseline_s: float = 4.0,
    quiesce_s: float = 120.0,
) -> dict[str, Any]:
    """Fire `arrivals` open-loop, wait until every claim is Ready (or the timeout), analyse."""
    tracker = ClaimTracker(bench.api, dwell=dwell)
    await tracker.start()
    # The tracker's pending deletes are cancelled however the phase ends (Ctrl-C, a failed wait): left
    # running they woke after the teardown had closed the API client ("Task exception was never retrieved").
    try:
        # Start from a settled system: a pool reports Ready before the controller has worked off the tail of
        # its fill (status echoes, pod-name annotations), which would otherwise land inside the measurement.
        quiet_after = await wait_quiescent(bench, within=quiesce_s) if quiesce_s > 0 else 0.0
        # Idle baseline (kwok heartbeats, leases, informer resyncs): subtracted from the per-claim CPU cost.
        b0 = time.time()
        await asyncio.sleep(baseline_s)
        baseline = bench.sampler.between(b0, time.time()) if baseline_s > 0 else {}
        before = await scrape_metrics(bench)
        duration = arrivals[-1] if arrivals else 0.0
        profile_path: Path | None = None
        profiler = None
        if profile_label and controller_profile:
            profile_path = profile_path_for(bench.cluster.name, profile_label)
            profiler = bench.profiler(
                duration + 3.0, profile_path, rate=int(os.environ.get("BENCH_PROFILE_HZ", "100"))
            )
        api_profile = None
        if profile_label and bench.tuning.apiserver_profiling:
            api_path = (
                RESULTS
                / "profiles"
                / f"{profile_path_for(bench.cluster.name, profile_label).stem}-apiserver.pprof"
            )
            api_profile = asyncio.create_task(
                apiserver_profile.capture(bench.cluster, duration + 3.0, api_path)
            )
        watcher = ClientWatchProcess(str(bench.cluster.kubeconfig), bench.cluster.directory / "client-watch")
        if not await watcher.wait_watching():
            bench.notes.append("client watch process did not start: no client_process view")
        try:
            t_start = time.time()
            t0 = await tracker.drive(arrivals, targets, prefix=prefix)
            await tracker.wait_sent()
            complete = await tracker.wait_ready(len(arrivals), ready_timeout)
            t_done = time.time()
            await tracker.wait_annotations(10.0)
        finally:
            seen_elsewhere = await watcher.stop()
        after = await scrape_metrics(bench)
        await finish_profiler(profiler)
        api_profile_path = await api_profile if api_profile is not None else None
        if dwell is not None:
            deadline = time.monotonic() + dwell + 60
            while tracker.deleted < tracker.ready_count and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    finally:
        await tracker.stop()
    result = analyse_claims(tracker, t0, before, after)
    result["latency_ms"]["client_process"] = summarize(as_ms(process_view(tracker, seen_elsewhere)))
    result["complete"] = complete
    result["usage"] = bench.sampler.between(t_start, t_done)
    result["baseline_cores"] = baseline.get("cpu_cores", {})
    result["quiet_after_s"] = round(quiet_after, 1)
    result["profile"] = profile_summary_for(profile_path)
    result["apiserver_profile"] = apiserver_profile.summarize(api_profile_path)
    return result


async def create_pools(
    bench: Bench, pools: Sequence[tuple[str, str]], replicas: int, p: Params, *, label: str
) -> None:
    """One namespace, template and pool of `replicas` per (namespace, pool); wait Ready, then settle."""
    for ns, pool in pools:
        await bench.ensure_namespace(ns)
        await bench.create_template(ns)
        await bench.create_pool(ns, pool, replicas)
    await bench.wait_pools_ready(pools, float(p["pool_timeout"]), label=label)
    await asyncio.sleep(float(p["settle"]))
