"""The six benchmark scenarios of docs/performance.md, each on its own gate-tuned local cluster.

Owns: `SCENARIOS` (each scenario's summary, default parameters, smoke preset and driver) and `run_scenario`
(one run wrapped with the host, load and parameters). Each driver has a module of its own (`burst`,
`sustained`, `refill`, `cold`, `scale`, `overload`); what they share is in `claim_phase`, `cluster` (`Bench`)
and `scenario_params`.

| scenario | what | upstream anchor (operations spec §9) |
|---|---|---|
| burst | pool 1050, 75 claims/s for 10 s (750 claims, uniform pacing) | KWOK gate: P50/P90 <= 300 ms, P99 <= 500 ms |
| sustained | Poisson arrivals over 4 pools (one namespace each) at 45/s for 60 s, claims deleted 5 s after Ready; then rising steps until client P99 > 500 ms (the knee) | 45/s: p50 92 / p90 182 / p99 376 ms |
| refill | one pool scaled 0 -> 300, time to all Ready and creates/s | pool 0 -> 300 Ready in ~6.4 s |
| cold | 1000 Sandboxes without a pool, time to all Ready (`benchmarks/sandbox_cold.py`) | - |
| scale | 5000 idle Sandboxes: controller RSS/CPU idle, CPU per reconcile of a no-op event | capacity-cliff snapshots |
| overload | Poisson over 4 pools at 2 x the knee (30/s) for 60 s, leader election on (`benchmarks/overload.py`) | issue 11: lease kept, every claim completes |

Parameters have defaults (full size), a smoke preset (`--smoke`: minutes, not tens of minutes), and are
overridable by environment (`BENCH_<KEY>=value`, e.g. `BENCH_RATE=20`) and by `--set key=value`.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.devcluster.config import KWOK_POD_PARALLELISM, POD_DELETION_INSTANT

from .burst import run_burst
from .cold import run_cold
from .host import host_info
from .overload import run_overload
from .refill import run_refill
from .scale import run_scale
from .scenario_params import Params, Scenario
from .sustained import run_sustained

__all__ = ["SCENARIOS", "run_scenario"]


_COMMON = {
    "nodes": 100,
    "settle": 3.0,
    "profile": False,
    "apiserver_profile": False,
    "controller_flags": "",
    "serve_v1alpha1": True,
    "pod_deletion": POD_DELETION_INSTANT,
    # kwok's pod stage workers (its default 4, as kwokctl runs the upstream KWOK gate; docs/devcluster.md).
    "kwok_pod_parallelism": KWOK_POD_PARALLELISM,
    # Path of another controller build to run instead of ours (upstream's Go binary; docs/performance.md).
    "controller_binary": "",
}
_SMOKE_COMMON = {"nodes": 10, "settle": 1.0}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "burst",
            "pool 1050, 75 claims/s for 10 s (the upstream KWOK gate)",
            {
                **_COMMON,
                "pool": 1050,
                "rate": 75.0,
                "seconds": 10.0,
                "pool_timeout": 900.0,
                "ready_timeout": 300.0,
                # Seconds to wait for the controller to go quiet after the pool reports Ready. 0 (default):
                # the burst starts `settle` s after Ready, as upstream's gate and users do (issue 20); the
                # older figures waited up to 120 s for quiet (`--set quiesce_s=120` reproduces them).
                "quiesce_s": 0.0,
            },
            {**_SMOKE_COMMON, "pool": 60, "rate": 10.0, "seconds": 5.0},
            run_burst,
        ),
        Scenario(
            "sustained",
            "Poisson arrivals over 4 pools at 45/s for 60 s, then rising rates to the P99 <= 500 ms knee",
            {
                **_COMMON,
                "pools": 4,
                "rate": 45.0,
                "seconds": 60.0,
                "steps": "75,100,150,200,250,300,400",
                "down_steps": "30,20,10",
                "step_seconds": 30.0,
                "dwell_s": 5.0,
                "headroom_s": 10.0,
                "min_pool": 20,
                "knee_p99_ms": 500.0,
                "seed": 20260101,
                "pool_timeout": 900.0,
            },
            {
                **_SMOKE_COMMON,
                "rate": 8.0,
                "seconds": 10.0,
                "steps": "16",
                "down_steps": "4",
                "step_seconds": 10.0,
                "min_pool": 10,
            },
            run_sustained,
        ),
        Scenario(
            "refill",
            "one pool scaled 0 -> 300: time to all Ready, creates/s",
            {**_COMMON, "replicas": 300, "ready_timeout": 600.0},
            {**_SMOKE_COMMON, "replicas": 40},
            run_refill,
        ),
        Scenario(
            "cold",
            "1000 Sandboxes without a pool: time to all Ready (benchmarks/sandbox_cold.py)",
            {**_COMMON, "count": 1000},
            {**_SMOKE_COMMON, "count": 40},
            run_cold,
        ),
        Scenario(
            "scale",
            "5000 idle Sandboxes: controller RSS and CPU, CPU per reconcile of a no-op event",
            {
                **_COMMON,
                "count": 5000,
                "concurrency": 100,
                "idle_s": 30.0,
                "quiesce_s": 180.0,
                "touch": 500,
                "ready_timeout": 1800.0,
            },
            {**_SMOKE_COMMON, "count": 100, "idle_s": 5.0, "quiesce_s": 30.0, "touch": 50},
            run_scale,
        ),
        Scenario(
            "overload",
            "Poisson over 4 pools at 2 x the knee for 60 s, leader election on: P50/P99, completed, lease",
            {
                **_COMMON,
                "pools": 4,
                "knee": 15.0,
                "factor": 2.0,
                "seconds": 60.0,
                "dwell_s": 5.0,
                "headroom_s": 10.0,
                "min_pool": 20,
                "seed": 20261201,
                "pool_timeout": 900.0,
                "ready_timeout": 900.0,
            },
            {**_SMOKE_COMMON, "knee": 4.0, "seconds": 10.0, "min_pool": 10, "ready_timeout": 120.0},
            run_overload,
        ),
    )
}


async def run_scenario(scenario: Scenario, params: Params) -> dict[str, Any]:
    """Run one scenario and wrap its result with the host, load and parameters."""
    host = host_info()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    out = await scenario.run(params)
    load_after = list(os.getloadavg())
    return {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "started": started,
        "duration_s": round(time.monotonic() - t0, 1),
        "smoke": bool(params.get("smoke")),
        "params": params,
        "host": host,
        "load": {"before": host["loadavg"], "after": load_after},
        **out,
    }
