"""The controller SIGKILLed at random moments during a claim burst, then checked from the audit log.

Owns: one crash trial (a pool, a burst of claims sent at once, the controller killed with SIGKILL -- no
drain, no lease release -- at random moments while the burst is in flight and restarted with the exact
same argv each time, then the namespace settled and `check_burst` run over the audit log) and the runner
of many trials (`python -m benchmarks.reliability crash`, results in benchmarks/results/).

The kill moments are drawn uniformly from the window in which the burst is being created and bound, and
each kill records how many claims were Ready at that moment, so a report shows the kills landed
mid-burst rather than before or after it.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.audit import AuditLog
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import ApiClient

from . import controllers
from .burst import create_claims, create_template_and_pool, ready_count, settle
from .invariants import BurstCheck, check_burst

__all__ = ["CrashTrial", "Kill", "crash_trial"]


@dataclass(frozen=True)
class Kill:
    """One SIGKILL: when (seconds after the burst started), claims Ready then, seconds until /readyz again."""

    at_s: float
    ready_claims: int
    restart_s: float


@dataclass
class CrashTrial:
    """One trial: the kills, how long the namespace took to settle, and the invariants' counts."""

    claims: int
    replicas: int
    kills: list[Kill] = field(default_factory=list)
    settle_s: float = 0.0
    complete: bool = False
    check: BurstCheck = field(default_factory=BurstCheck)

    def as_dict(self) -> dict[str, Any]:
        return {
            "claims": self.claims,
            "replicas": self.replicas,
            "kills": [asdict(k) for k in self.kills],
            "settle_s": round(self.settle_s, 2),
            "complete": self.complete,
            "check": self.check.as_dict(),
        }


async def crash_trial(
    cluster: DevCluster,
    api: ApiClient,
    namespace: str,
    controller: Started,
    *,
    claims: int,
    replicas: int,
    kills: int,
    window_s: float,
    rng: random.Random,
    settle_within: float = 600.0,
) -> tuple[CrashTrial, Started]:
    """Run one trial in `namespace` (empty, on a cluster with the audit log on); returns the running controller.

    `controller` must have been started by `controllers.start` (recorded argv, so it can be respawned).
    """
    audit = AuditLog(cluster.audit_log)
    mark = audit.mark()
    trial = CrashTrial(claims=claims, replicas=replicas)
    await create_template_and_pool(api, namespace, replicas)
    await settle(api, namespace, claims=0, replicas=replicas, within=settle_within)

    names = [f"c-{i:04d}" for i in range(claims)]
    started = time.monotonic()
    burst = asyncio.create_task(create_claims(api, namespace, names))
    for at in sorted(rng.uniform(0.2, window_s) for _ in range(kills)):
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        killed = time.monotonic()
        ready = await ready_count(api, namespace)
        controllers.sigkill(controller)
        controller = await asyncio.to_thread(controllers.respawn, cluster)
        trial.kills.append(Kill(round(killed - started, 2), ready, round(time.monotonic() - killed, 2)))
    await burst
    settled = await settle(api, namespace, claims=claims, replicas=replicas, within=settle_within)
    trial.settle_s = time.monotonic() - started
    trial.complete = settled.complete
    trial.check = check_burst(settled, audit.since(mark), namespace=namespace, replicas=replicas)
    return trial, controller
