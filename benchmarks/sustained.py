"""The sustained scenario and its knee: Poisson arrivals over 4 pools, then rising rates until P99 breaks.

Owns: `run_sustained`. Claims arrive at 45/s for 60 s over 4 pools (one namespace each) and are deleted 5 s
after Ready (upstream's sustained phase: p50 92 / p90 182 / p99 376 ms); then rising steps until the client
create->Ready P99 exceeds 500 ms (the knee), or, when the reference rate already fails, falling steps until
it holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent_sandbox.kube import SANDBOX

from .claim_phase import claim_phase, create_pools
from .cluster import Bench
from .log import log
from .scenario_params import Params, tuning_from_params
from .schedule import poisson_arrivals, pool_replicas, round_robin

__all__ = ["run_sustained"]


def _gate_ok(phase: Mapping[str, Any], threshold_ms: float) -> bool:
    p99 = phase["latency_ms"]["client_watch"].get("p99")
    return bool(phase["complete"] and not phase["create_errors"] and p99 is not None and p99 <= threshold_ms)


async def _resize_pools(
    bench: Bench, pools: Sequence[tuple[str, str]], replicas: int, within: float
) -> float:
    for ns, pool in pools:
        await bench.scale_pool(ns, pool, replicas)
    return await bench.wait_pools_ready(pools, within, label=f"pools x{replicas}")


async def _wait_gc(bench: Bench, namespaces: Sequence[str], want: int, within: float) -> int:
    """Wait until the namespaces hold `want` Sandboxes (deleted claims' Sandboxes collected)."""
    deadline = time.monotonic() + within
    while True:
        have = sum([await bench.count(SANDBOX, ns) for ns in namespaces])
        if have <= want or time.monotonic() > deadline:
            return have
        await asyncio.sleep(1.0)


async def run_sustained(p: Params) -> dict[str, Any]:
    npools = int(p["pools"])
    tuning = tuning_from_params(p, warm_pool_workers=max(npools, 1))
    pools = [(f"bench-sustained-{i}", "warmpool-0") for i in range(npools)]
    namespaces = [ns for ns, _ in pools]
    headroom, dwell = float(p["headroom_s"]), float(p["dwell_s"])
    threshold = float(p["knee_p99_ms"])
    async with Bench.up("bench-sustained", tuning) as bench:
        replicas = pool_replicas(float(p["rate"]), npools, headroom, minimum=int(p["min_pool"]))
        await create_pools(bench, pools, replicas, p, label="sustained pools")
        phases: list[dict[str, Any]] = []
        up = [float(x) for x in str(p["steps"]).split(",") if x.strip()]
        down = [float(x) for x in str(p["down_steps"]).split(",") if x.strip()]
        rates = [float(p["rate"]), *up]
        knee: float | None = None
        broke_at: float | None = None
        k = -1
        while k + 1 < len(rates):
            k += 1
            rate = rates[k]
            seconds = float(p["seconds"]) if k == 0 else float(p["step_seconds"])
            want = pool_replicas(rate, npools, headroom, minimum=int(p["min_pool"]))
            if want > replicas:
                replicas = want
            if k > 0:
                await _wait_gc(bench, namespaces, replicas * npools, 180.0)
                await _resize_pools(bench, pools, replicas, float(p["pool_timeout"]))
                await asyncio.sleep(float(p["settle"]))
            arrivals = poisson_arrivals(rate, seconds, int(p["seed"]) + k)
            targets = [(ns, "warmpool-0") for ns in round_robin(len(arrivals), namespaces)]
            log(
                f"sustained: {rate:g}/s for {seconds:g}s ({len(arrivals)} claims), pools {npools} x {replicas}"
            )
            phase = await claim_phase(
                bench,
                arrivals=arrivals,
                targets=targets,
                prefix=f"s{k}",
                dwell=dwell,
                ready_timeout=max(60.0, seconds),
                profile_label=f"r{rate:g}" if p["profile"] or p["apiserver_profile"] else None,
                controller_profile=bool(p["profile"]),
            )
            phase.update(
                {"rate": rate, "seconds": seconds, "pool_replicas": replicas, "seed": int(p["seed"]) + k}
            )
            ok = _gate_ok(phase, threshold)
            phase["passes_p99"] = ok
            phases.append(phase)
            lat = phase["latency_ms"]
            log(
                f"  -> client p50/p90/p99 {lat['client_watch'].get('p50')}/{lat['client_watch'].get('p90')}/"
                f"{lat['client_watch'].get('p99')} ms, histogram p99 {lat['controller_histogram'].get('p99')}"
                f" ms, complete={phase['complete']}, ok={ok}"
            )
            if k == 0:
                if ok:
                    knee = rate
                else:  # the reference rate already breaks: step down instead, to find where it holds
                    broke_at = rate
                    rates = [rate, *down]
                continue
            if ok:
                knee = rate if knee is None or rate > knee else knee
                if rate < rates[0]:
                    break  # stepping down: the first rate that holds is the knee
            elif rate > rates[0]:
                broke_at = rate
                break
        return {
            "cluster": bench.describe(),
            "notes": bench.notes,
            "result": {
                "phases": phases,
                "knee_per_s": knee,
                "broke_at_per_s": broke_at,
                "knee_criterion": f"client create->Ready P99 <= {threshold:g} ms, all Ready, no create errors"
                " (steps up from the reference rate while it holds, down through `down_steps` if it does not)",
            },
        }
