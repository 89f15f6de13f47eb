"""The refill scenario: one warm pool scaled 0 -> 300, time until every member is Ready and creates/s.

Owns: `run_refill` (upstream's reference: pool 0 -> 300 Ready in ~6.4 s).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .cluster import Bench
from .controller_profile import finish_profiler, profile_path_for, profile_summary_for
from .phase_metrics import metric_deltas, scrape_metrics
from .scenario_params import Params, tuning_from_params
from .stats import peak_rate, rate_series
from .trackers import SandboxTracker

__all__ = ["run_refill"]


async def run_refill(p: Params) -> dict[str, Any]:
    ns, pool, target = "bench-refill", "warmpool-0", int(p["replicas"])
    async with Bench.up("bench-refill", tuning_from_params(p)) as bench:
        await bench.ensure_namespace(ns)
        await bench.create_template(ns)
        await bench.create_pool(ns, pool, 0)
        await asyncio.sleep(float(p["settle"]))
        tracker = SandboxTracker(bench.api, ns)
        await tracker.start()
        before = await scrape_metrics(bench)
        profile_path = profile_path_for("bench-refill", "fill") if p["profile"] else None
        profiler = bench.profiler(20.0, profile_path) if profile_path else None
        t0 = time.time()
        await bench.scale_pool(ns, pool, target)
        complete = await tracker.wait_ready(target, float(p["ready_timeout"]))
        t1 = time.time()
        await bench.wait_pools_ready([(ns, pool)], 60.0, label="refill pool status")
        t_status = time.time()
        after = await scrape_metrics(bench)
        await finish_profiler(profiler)
        await tracker.stop()
        added = sorted(t - t0 for t in tracker.added.values())
        ready = sorted(t - t0 for t in tracker.ready.values())
        create_series = rate_series(added)
        ready_series = rate_series(ready)
        create_span = (added[-1] - added[0]) if len(added) > 1 else 0.0
        return {
            "cluster": bench.describe(),
            "notes": bench.notes,
            "result": {
                "replicas": target,
                "complete": complete,
                "created": len(added),
                "all_ready_s": round(ready[-1], 3) if ready else None,
                "pool_status_ready_s": round(t_status - t0, 3),
                "first_create_s": round(added[0], 3) if added else None,
                "first_ready_s": round(ready[0], 3) if ready else None,
                "creates_per_s_mean": round((len(added) - 1) / create_span, 1) if create_span > 0 else None,
                "creates_per_s_peak_1s": round(peak_rate(create_series), 1),
                "ready_per_s_mean": round(len(ready) / ready[-1], 1) if ready else None,
                "ready_per_s_peak_1s": round(peak_rate(ready_series), 1),
                "series": {"created_per_s": create_series, "ready_per_s": ready_series},
                "usage": bench.sampler.between(t0, t1),
                "profile": profile_summary_for(profile_path),
                **metric_deltas(before, after),
            },
        }
