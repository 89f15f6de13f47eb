"""The overload scenario (issue 11 part 2): offered rate 2x the knee for 60 s, leader election on.

What it answers: above the knee, does the controller keep its lease, serve every claim once the load
stops, and degrade no worse than upstream (at 20 claims/s upstream's median was 6.4 s on this box)?

Same shape as `sustained` (Poisson arrivals over 4 pools, one namespace each, claims deleted `dwell_s`
after Ready, pools sized for the *knee* with `headroom_s`), at `factor` x `knee` claims/s for `seconds`,
then waits up to `ready_timeout` for every claim. Unlike the other scenarios the controller runs with
leader election on (`--leader-elect=true`, Lease in `kube-system`), and a poller reads the Lease every
0.5 s: renewals (distinct `renewTime`s), the largest gap between consecutive renewals, and holder changes.
A lost lease makes the controller exit, so `controller_alive` is reported too.

Reports client create->Ready P50/P90/P99, the controller histogram, completed claims, the warm/cold split
and latency by 10 s send window (claims served in arrival order show latencies rising, not scattered).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.kube import LEASE, ApiClient, KubeError

from .claim_phase import claim_phase, create_pools
from .cluster import Bench
from .log import log
from .objects import parse_rfc3339
from .scenario_params import tuning_from_params
from .schedule import poisson_arrivals, pool_replicas, round_robin

__all__ = ["LEASE_NAMESPACE", "LeaseWatch", "run_overload"]

LEASE_NAMESPACE = "kube-system"
LEASE_NAME = "a3317529.agent-sandbox.x-k8s.io"  # controllers.main.LEADER_ELECTION_ID (upstream's)
POLL_S = 0.5


@dataclass
class LeaseWatch:
    """Polls the leader-election Lease: every renewal and holder seen while `run` is active."""

    api: ApiClient
    renewals: list[float] = field(default_factory=list)  # renewTime (epoch s) of each distinct renewal
    holders: list[str] = field(default_factory=list)  # distinct holderIdentity values, in order
    errors: int = 0

    async def run(self) -> None:
        last = ""
        while True:
            try:
                lease = await self.api.get(LEASE, LEASE_NAME, namespace=LEASE_NAMESPACE)
            except KubeError:
                self.errors += 1
            else:
                spec = lease.get("spec") or {}
                holder = spec.get("holderIdentity") or ""
                if holder and (not self.holders or self.holders[-1] != holder):
                    self.holders.append(holder)
                renew = spec.get("renewTime") or ""
                t = parse_rfc3339(renew)
                if renew != last and t is not None:
                    self.renewals.append(t)
                    last = renew
            await asyncio.sleep(POLL_S)

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        """Renewals between epoch `t0` and `t1` and the largest gap (a rival takes over after 15 s)."""
        inside = [t for t in self.renewals if t0 <= t <= t1]
        edges = [t0, *inside, t1]
        gaps = [b - a for a, b in itertools.pairwise(edges)]
        return {
            "renewals": len(inside),
            "max_gap_s": round(max(gaps), 2) if gaps else None,
            "holders": list(self.holders),
            "holder_changes": max(0, len(self.holders) - 1),
            "poll_errors": self.errors,
        }


def _controller_alive(bench: Bench) -> bool:
    try:
        os.kill(bench.controller.pid, 0)
    except OSError:
        return False
    return True


async def run_overload(p: dict[str, Any]) -> dict[str, Any]:
    npools = int(p["pools"])
    rate = float(p["knee"]) * float(p["factor"])
    flags = f"{p['controller_flags']} --leader-elect=true --leader-election-namespace={LEASE_NAMESPACE}"
    tuning = tuning_from_params({**p, "controller_flags": flags}, warm_pool_workers=max(npools, 1))
    pools = [(f"bench-overload-{i}", "warmpool-0") for i in range(npools)]
    replicas = pool_replicas(float(p["knee"]), npools, float(p["headroom_s"]), minimum=int(p["min_pool"]))
    async with Bench.up("bench-overload", tuning) as bench:
        lease = LeaseWatch(bench.api)
        poller = asyncio.create_task(lease.run())
        try:
            await create_pools(bench, pools, replicas, p, label="overload pools")
            arrivals = poisson_arrivals(rate, float(p["seconds"]), int(p["seed"]))
            targets = [(ns, "warmpool-0") for ns in round_robin(len(arrivals), [ns for ns, _ in pools])]
            log(
                f"overload: {rate:g}/s ({p['factor']} x knee {p['knee']}) for {p['seconds']}s "
                f"({len(arrivals)} claims), pools {npools} x {replicas}, leader election on"
            )
            t0 = time.time()
            phase = await claim_phase(
                bench,
                arrivals=arrivals,
                targets=targets,
                prefix="ov",
                dwell=float(p["dwell_s"]),
                ready_timeout=float(p["ready_timeout"]),
                profile_label="overload" if p["profile"] or p["apiserver_profile"] else None,
                controller_profile=bool(p["profile"]),
            )
            t1 = time.time()
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        phase.update({"rate": rate, "seconds": float(p["seconds"]), "pool_replicas": replicas})
        phase["lease"] = lease.summary(t0, t1)
        phase["controller_alive"] = _controller_alive(bench)
        lat = phase["latency_ms"]["client_watch"]
        log(
            f"  -> client p50/p99 {lat.get('p50')}/{lat.get('p99')} ms, ready {phase['ready']}/{phase['claims']},"
            f" {phase['launch_types']}, lease {phase['lease']}, alive={phase['controller_alive']}"
        )
        return {"cluster": bench.describe(), "notes": bench.notes, "result": phase}
