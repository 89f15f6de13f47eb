"""The cold scenario: 1000 Sandboxes without a pool, time until all are Ready.

Owns: `run_cold`, which runs `benchmarks/sandbox_cold.py`'s measurement on a gate-tuned `Bench` and adds the
components' CPU and memory over it.
"""

from __future__ import annotations

import time
from typing import Any

from .cluster import Bench
from .scenario_params import Params, tuning_from_params

__all__ = ["run_cold"]


async def run_cold(p: Params) -> dict[str, Any]:
    try:
        from . import sandbox_cold
    except ImportError as exc:  # the module belongs to the Sandbox controller's benchmark
        raise RuntimeError(f"benchmarks/sandbox_cold.py is needed for the cold scenario: {exc}") from exc
    async with Bench.up("bench-cold", tuning_from_params(p)) as bench:
        t0 = time.time()
        result = await sandbox_cold._run(
            bench.cluster, bench.controller.pid, bench.metrics_port, int(p["count"]), "bench-cold"
        )
        t1 = time.time()
        result["usage"] = bench.sampler.between(t0, t1)
        return {"cluster": bench.describe(), "notes": bench.notes, "result": result}
