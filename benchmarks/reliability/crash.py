"""The controller SIGKILLed at random moments during a claim burst, then checked from the audit log.

Owns: one crash trial (a pool, a burst of claims sent at once, the controller killed with SIGKILL -- no
drain, no lease release -- at random moments while the burst is in flight and restarted with the exact
same argv each time, then the namespace settled and `check_burst` run over the audit log) and the runner
of many trials (`python -m benchmarks.reliability crash`, results in benchmarks/results/).

The kill moments are drawn uniformly from the window in which the burst is being created and bound, and
each kill records how many claims were Ready at that moment, so a report shows the kills landed
mid-burst rather than before or after it.

A controller that exits on its own during a trial is started again at once, as its Deployment would be,
and counted (`unplanned_exits`): e.g. under heavy load the start-up CRD patch of the conversion webhook
can time out (504), and the manager exits with status 1 as upstream's does.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.audit import AuditLog
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.kube import ApiClient

from . import controllers
from .burst import create_claims, create_template_and_pool, ready_count, ready_counts, settle
from .invariants import BurstCheck, check_burst

__all__ = ["CrashTrial", "Kill", "crash_trial"]


@dataclass(frozen=True)
class Kill:
    """One SIGKILL: when (seconds after the burst started), claims Ready then, seconds until /readyz again."""

    at_s: float
    ready_claims: int
    restart_s: float
    created_claims: int = 0  # claims of the burst created by then (Ready < created: work was outstanding)


@dataclass
class CrashTrial:
    """One trial: the kills, how long the namespace took to settle, and the invariants' counts."""

    claims: int
    replicas: int
    kills: list[Kill] = field(default_factory=list)
    settle_s: float = 0.0
    complete: bool = False
    unplanned_exits: int = 0
    check: BurstCheck = field(default_factory=BurstCheck)

    def as_dict(self) -> dict[str, Any]:
        return {
            "claims": self.claims,
            "replicas": self.replicas,
            "kills": [asdict(k) for k in self.kills],
            "settle_s": round(self.settle_s, 2),
            "complete": self.complete,
            "unplanned_exits": self.unplanned_exits,
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
    at_ready_share: bool = False,
) -> tuple[CrashTrial, Started]:
    """Run one trial in `namespace` (empty, on a cluster with the audit log on); returns the running controller.

    `controller` must have been started by `controllers.start` (recorded argv, so it can be respawned).
    Kills land at random moments within `window_s` seconds of the burst's start, or with `at_ready_share`
    mid-burst however fast the machine is: the burst is created in chunks, one after the other, and a kill
    lands when a random share (10-80 %) of the current chunk is Ready and some of it is not. A chunk seen
    all Ready at once gets no kill: the next chunk, cut from what is left of the burst so that about two
    spare chunks stay behind every owed kill, takes it (a fixed split into `2 * kills + 1` chunks ran out:
    its last chunk, all Ready at the first look, took a kill after the burst). (Triggering
    on a share of the whole burst let a kill land after it: a restarted controller finishes everything that
    was in flight at once, so the Ready count can jump from a third to all of the claims between two looks.)
    """
    audit = AuditLog(cluster.audit_log)
    mark = audit.mark()
    trial = CrashTrial(claims=claims, replicas=replicas)
    keeper = _Keeper(cluster, controller)
    watching = asyncio.create_task(keeper.watch())
    try:
        await create_template_and_pool(api, namespace, replicas)
        await settle(api, namespace, claims=0, replicas=replicas, within=settle_within)
        names = [f"c-{i:04d}" for i in range(claims)]
        started = time.monotonic()
        if at_ready_share:
            pending, created = list(names), 0
            while pending:
                owed = kills - len(trial.kills)
                if owed == 0:  # every kill landed: the rest of the burst goes at once
                    await create_claims(api, namespace, pending)
                    break
                # A chunk per look, sized so that every owed kill has about two spare chunks behind it;
                # the chunks shrink as they are used, so there is always one more to try. At least 4: a
                # chunk of one is either none or all Ready, never part of it.
                size = max(min(4, len(pending)), len(pending) // (2 * owed + 1))
                chunk, pending = pending[:size], pending[size:]
                await create_claims(api, namespace, chunk)
                created += len(chunk)
                share = rng.uniform(0.1, 0.8)
                while True:  # polling the API server is the point: the kill follows observed progress
                    ready, in_chunk = await ready_counts(api, namespace, chunk)
                    if in_chunk >= share * len(chunk):
                        break
                    await asyncio.sleep(0.05)
                if in_chunk == len(chunk) and pending:
                    continue  # all of it Ready already: not mid-burst; the next chunk takes this kill
                killed = time.monotonic()
                await keeper.kill_and_respawn()
                trial.kills.append(
                    Kill(round(killed - started, 2), ready, round(time.monotonic() - killed, 2), created)
                )
        else:
            burst = asyncio.create_task(create_claims(api, namespace, names))
            for at in sorted(rng.uniform(0.2, window_s) for _ in range(kills)):  # seconds after the start
                await asyncio.sleep(max(0.0, started + at - time.monotonic()))
                ready = await ready_count(api, namespace)
                killed = time.monotonic()
                await keeper.kill_and_respawn()
                trial.kills.append(
                    Kill(round(killed - started, 2), ready, round(time.monotonic() - killed, 2), claims)
                )
            await burst
        settled = await settle(api, namespace, claims=claims, replicas=replicas, within=settle_within)
    finally:
        watching.cancel()
    trial.settle_s = time.monotonic() - started
    trial.complete = settled.complete
    trial.unplanned_exits = keeper.unplanned_exits
    trial.check = check_burst(
        settled, audit.since(mark, unfinished=True), namespace=namespace, replicas=replicas
    )
    return trial, keeper.current


class _Keeper:
    """Keeps one controller running: planned SIGKILLs, and a restart when it exits on its own."""

    def __init__(self, cluster: DevCluster, controller: Started) -> None:
        self.cluster = cluster
        self.current = controller
        self.unplanned_exits = 0
        self._turn = asyncio.Lock()

    async def kill_and_respawn(self) -> None:
        async with self._turn:
            controllers.sigkill(self.current)
            self.current = await asyncio.to_thread(controllers.respawn, self.cluster)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            async with self._turn:
                if is_ours(self.current.pid, self.current.exe):
                    continue
                stop(self.current)  # reap it
                self.unplanned_exits += 1
                try:
                    self.current = await asyncio.to_thread(controllers.respawn, self.cluster)
                except Exception:  # it died again while starting: the next turn tries again
                    await asyncio.sleep(2)
