"""The scale scenario: 5000 idle Sandboxes - the controller's memory and CPU at rest, and per reconcile.

Owns: `run_scale`: fill (create `count` Sandboxes, time to all Ready, controller CPU per reconcile), idle
(nothing changes: what holding them costs in CPU and RSS) and touch (a metadata-only change on `touch`
Sandboxes: the controller's CPU per event and per no-op reconcile, net of idle).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agent_sandbox.kube import SANDBOX, KubeError, Object

from .cluster import Bench
from .log import log
from .phase_metrics import metric_deltas, scrape_metrics, wait_quiescent
from .proc_sampling import peak_rss_mib
from .scenario_params import Params, tuning_from_params
from .trackers import SandboxTracker

__all__ = ["run_scale"]


def _sandbox(name: str) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "alpine"}]}}},
    }


async def _bounded(names: Sequence[str], fn: Callable[[str], Awaitable[Any]], limit: int) -> int:
    """Run `fn(name)` for every name with at most `limit` in flight; returns the number of API errors."""
    sem = asyncio.Semaphore(limit)
    errors = 0

    async def one(name: str) -> None:
        nonlocal errors
        async with sem:
            try:
                await fn(name)
            except KubeError:
                errors += 1

    await asyncio.gather(*(one(n) for n in names))
    return errors


async def run_scale(p: Params) -> dict[str, Any]:
    ns, count = "bench-scale", int(p["count"])
    async with Bench.up("bench-scale", tuning_from_params(p)) as bench:
        await bench.ensure_namespace(ns)
        tracker = SandboxTracker(bench.api, ns)
        await tracker.start()
        pid = bench.controller.pid
        base = bench.sampler.sample()
        m0 = await scrape_metrics(bench)
        t0 = time.time()
        api = bench.api
        names = [f"sb-{i:05d}" for i in range(count)]

        async def create(name: str) -> Any:
            return await api.create(SANDBOX, _sandbox(name), namespace=ns)

        async def touch_one(name: str) -> Any:
            patch = {"metadata": {"annotations": {"bench/touch": "1"}}}
            return await api.patch(SANDBOX, name, patch, namespace=ns)

        errors = await _bounded(names, create, int(p["concurrency"]))
        created_s = time.time() - t0
        complete = await tracker.wait_ready(count, float(p["ready_timeout"]))
        t1 = time.time()
        await asyncio.sleep(float(p["settle"]))
        m1 = await scrape_metrics(bench)
        fill_usage = bench.sampler.between(t0, t1)
        fill_deltas = metric_deltas(m0, m1)
        fill_cpu = (
            bench.sampler.sample()["cpu"]["agent-sandbox-controller"]
            - base["cpu"]["agent-sandbox-controller"]
        )

        # Idle: nothing changes; what does holding N objects cost? First let the backlog drain (the
        # Sandbox queue can lag the last Ready by seconds), so the window measures the steady state.
        quiet_after = await wait_quiescent(bench, within=float(p["quiesce_s"]))
        log(
            f"scale: {count} Sandboxes Ready in {t1 - t0:.1f}s, quiet {quiet_after:.0f}s later; idle {p['idle_s']}s"
        )
        mi0 = await scrape_metrics(bench)
        i0 = time.time()
        await asyncio.sleep(float(p["idle_s"]))
        i1 = time.time()
        mi1 = await scrape_metrics(bench)
        idle = bench.sampler.between(i0, i1)
        idle_deltas = metric_deltas(mi0, mi1)
        idle_ctrl_cores = float((idle.get("cpu_cores") or {}).get("agent-sandbox-controller", 0.0))

        # Reconcile cost per event: a metadata-only change on `touch` Sandboxes -> one event + one
        # (no-op) reconcile each.
        touch = min(int(p["touch"]), count)
        m2 = await scrape_metrics(bench)
        c2 = bench.sampler.sample()["cpu"]["agent-sandbox-controller"]
        k0 = time.time()
        await _bounded(names[:touch], touch_one, int(p["concurrency"]))
        await asyncio.sleep(float(p["settle"]))
        k1 = time.time()
        m3 = await scrape_metrics(bench)
        c3 = bench.sampler.sample()["cpu"]["agent-sandbox-controller"]
        touch_deltas = metric_deltas(m2, m3)
        touch_reconciles = touch_deltas["reconciles"].get("sandbox", 0.0)
        # Net of what the controller burns at rest over the same window.
        touch_cpu = max(0.0, (c3 - c2) - idle_ctrl_cores * (k1 - k0))
        await tracker.stop()
        memory = {k: round(v / 2**20, 1) for k, v in bench.cluster.memory().items()}
        fill_reconciles = sum(fill_deltas["reconciles"].values())
        return {
            "cluster": bench.describe(),
            "notes": bench.notes,
            "result": {
                "count": count,
                "complete": complete,
                "create_errors": errors,
                "create_requests_s": round(created_s, 1),
                "all_ready_s": round(t1 - t0, 1),
                "ready_per_s_mean": round(count / (t1 - t0), 1),
                "fill": {
                    "usage": fill_usage,
                    "controller_cpu_s": round(fill_cpu, 2),
                    "reconciles": fill_deltas["reconciles"],
                    "controller_requests": fill_deltas["controller_requests"],
                    "cpu_ms_per_reconcile": round(1000 * fill_cpu / fill_reconciles, 2)
                    if fill_reconciles
                    else None,
                    "cpu_ms_per_sandbox": round(1000 * fill_cpu / count, 2),
                },
                "quiet_after_ready_s": round(quiet_after, 1),
                "idle": {
                    **idle,
                    "reconciles": idle_deltas["reconciles"],
                    "controller_requests": idle_deltas["controller_requests"],
                    "apiserver_writes": idle_deltas["apiserver_writes"],
                    "controller_rss_mib": memory.get("agent-sandbox-controller"),
                    "controller_peak_rss_mib": peak_rss_mib(pid),
                    "rss_mib": memory,
                },
                "touch": {
                    "events": touch,
                    "seconds": round(k1 - k0, 1),
                    "reconciles": touch_deltas["reconciles"],
                    "controller_requests": touch_deltas["controller_requests"],
                    "controller_cpu_s": round(c3 - c2, 3),
                    "controller_cpu_net_of_idle_s": round(touch_cpu, 3),
                    "cpu_ms_per_event": round(1000 * touch_cpu / touch, 3) if touch else None,
                    "cpu_ms_per_reconcile": round(1000 * touch_cpu / touch_reconciles, 3)
                    if touch_reconciles
                    else None,
                },
            },
        }
