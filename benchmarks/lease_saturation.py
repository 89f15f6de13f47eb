"""Lease renewal under a saturated controller: the load behind issue 11's "never lose the lease", and its measurement.

The load (`saturated_controller`): a real `Manager` with client-go's leader-election timings (15/10/2 s)
whose shared API client is throttled to `Load.qps` (2/s, burst 1) while `Load.workers` (32) reconcilers
keep writing through it (each request then waits ~16 s for a token, longer than the renew deadline),
and every reconcile spins the CPU for `Load.spin` (0.4 s) without awaiting (the event loop is busy most
of the time). The integration test `tests/integration/kube/test_leaderelection_saturation.py` uses it to
show the lease is kept; this script measures renewal timing under it, run by hand:

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.lease_saturation [--runs 3] [--seconds 30]

Two elector arrangements, each idle and saturated, `--runs` times:

* `in-loop` (before issue 11): `LeaderElector` on the manager's loop with the shared client;
* `thread` (now): the manager's default `ThreadedLeaderElector` (own thread, loop, client and bucket).

Per run: every successful renewal round (seconds from the round's start to the successful write), the
gap between consecutive successful renewals (what a rival candidate sees; it takes over after 15 s), the
event loop's lag, and whether leadership was lost (and when). Writes
`benchmarks/results/lease-saturation-<UTC>.json` (no `scenario` key: it stays out of the generated
tables of docs/performance.md) and prints a markdown table with min/median/max over all runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.kube import (
    CONFIG_MAP,
    NAMESPACE,
    ApiClient,
    Builder,
    CacheOptions,
    Elector,
    KindOptions,
    LeaderElectionConfig,
    LeaderElectionLost,
    LeaderElector,
    Manager,
    ManagerOptions,
    RenewalRound,
    Request,
    Result,
)

from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .log import log
from .result_files import write_result
from .stats import summarize

__all__ = ["Load", "Saturated", "in_loop_elector", "saturated_controller"]


@dataclass(frozen=True, slots=True)
class Load:
    """How hard the controller is pushed (defaults: the integration test's load)."""

    qps: float = 2.0
    burst: int = 1
    workers: int = 32
    spin: float = 0.4
    objects: int = 64
    saturate: bool = True
    """False: the same manager and Lease with no reconcile load (the reference)."""


@dataclass
class Hog:
    """Reconciler that spins the CPU, then writes its ConfigMap (whose watch event queues it again)."""

    api: ApiClient
    spin: float
    write_waits: list[float] = field(default_factory=list)
    passes: int = 0
    stopping: bool = False
    """Set before the manager stops: reconciles then return at once, so the drain is quick."""

    async def reconcile(self, request: Request) -> Result:
        if self.stopping:
            return Result()
        end = time.monotonic() + self.spin
        while time.monotonic() < end:  # CPU-bound: holds the event loop
            pass
        self.passes += 1
        started = time.monotonic()
        patch = {"metadata": {"annotations": {"pass": str(self.passes)}}}
        await self.api.patch(CONFIG_MAP, request.name, patch, namespace=request.namespace)
        self.write_waits.append(time.monotonic() - started)
        return Result()


@dataclass
class Saturated:
    """A running saturated controller and what to observe about it."""

    manager: Manager
    hog: Hog
    task: asyncio.Task[None]
    loop_lag: list[float]

    @property
    def elector(self) -> Any:
        """The manager's elector (has `renew_rounds`, `is_leader`)."""
        return self.manager.elector


def in_loop_elector(api: ApiClient, cfg: LeaderElectionConfig) -> Elector:
    """The arrangement before issue 11: the elector on the manager's loop, sharing its client."""
    return LeaderElector(api, cfg)


async def _probe_loop_lag(lags: list[float]) -> None:
    """How late a 0.1 s sleep wakes up (the delay any coroutine step on the loop suffers)."""
    while True:
        started = time.monotonic()
        await asyncio.sleep(0.1)
        lags.append(time.monotonic() - started - 0.1)


@contextlib.asynccontextmanager
async def saturated_controller(
    kubeconfig: str,
    admin: ApiClient,
    namespace: str,
    *,
    lease: str,
    identity: str,
    load: Load = Load(),
    new_elector: Callable[[ApiClient, LeaderElectionConfig], Elector] | None = None,
) -> AsyncIterator[Saturated]:
    """Start the manager under `load` and yield once it leads; stop it (releasing the Lease) on exit.

    `admin` (unthrottled) creates the ConfigMaps; the manager gets its own throttled client.
    """
    label = f"saturation-{namespace}"
    if load.saturate:
        for i in range(load.objects):
            body = {"metadata": {"name": f"cm-{i}", "namespace": namespace, "labels": {"test": label}}}
            await admin.create(CONFIG_MAP, body)
    api = await ApiClient.from_kubeconfig(kubeconfig, qps=load.qps, burst=load.burst)
    opts = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        leader_election=True,
        leader_election_id=lease,
        leader_election_namespace=namespace,
        identity=identity,
        new_elector=new_elector,
        cache=CacheOptions(
            by_kind={CONFIG_MAP: KindOptions(label_selector=f"test={label}", namespace=namespace)}
        ),
    )
    mgr = Manager(api, opts)
    hog = Hog(api, load.spin)
    # A short drain: in-flight reconciles may be waiting ~16 s for a token; they are cancelled instead.
    Builder(mgr).for_(CONFIG_MAP).named("hog").with_options(workers=load.workers, drain_timeout=2.0).complete(
        hog
    )
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    lags: list[float] = []
    probe = asyncio.create_task(_probe_loop_lag(lags))
    try:
        await asyncio.wait_for(mgr.elected.wait(), 60)
        yield Saturated(mgr, hog, task, lags)
    finally:
        probe.cancel()
        hog.stopping = True
        stop.set()
        # asyncio.wait, not wait_for: a timeout must not cancel the manager mid-drain (that would orphan
        # its workers, still writing through the client closed below).
        await asyncio.wait({task}, timeout=120)
        if not task.done():
            raise RuntimeError("the saturated manager did not stop within 120 s")
        if not task.cancelled():
            task.exception()  # retrieved here; callers read it from `Saturated.task` as they need
        await api.close()


# --------------------------------------------------------------------------- measurement


@dataclass
class Run:
    arrangement: str
    saturated: bool
    rounds_s: list[float]
    gaps_s: list[float]
    lost_after_s: float | None
    loop_lag_max_s: float
    loop_lag_p50_s: float
    shared_client_wait_max_s: float
    reconciles: int


def _gaps(rounds: Sequence[RenewalRound]) -> list[float]:
    return [b.finished - a.finished for a, b in itertools.pairwise(rounds)]


async def _one(cluster: DevCluster, admin: ApiClient, arrangement: str, load: Load, seconds: float) -> Run:
    ns = f"lease-bench-{uuid.uuid4().hex[:8]}"
    await admin.create(NAMESPACE, {"metadata": {"name": ns}})
    factory = in_loop_elector if arrangement == "in-loop" else None
    try:
        async with saturated_controller(
            str(cluster.kubeconfig),
            admin,
            ns,
            lease="bench",
            identity="bench",
            load=load,
            new_elector=factory,
        ) as s:
            started = time.monotonic()
            lost_after: float | None = None
            await asyncio.wait({s.task}, timeout=seconds)  # returns early if the manager stops
            if s.task.done():
                lost_after = time.monotonic() - started
                exc = s.task.exception()
                if not isinstance(exc, LeaderElectionLost):
                    raise RuntimeError(f"manager stopped for another reason: {exc!r}")
            rounds = list(s.elector.renew_rounds)
            lags = sorted(s.loop_lag) or [0.0]
            return Run(
                arrangement,
                load.saturate,
                [round(r.seconds, 4) for r in rounds],
                [round(g, 4) for g in _gaps(rounds)],
                None if lost_after is None else round(lost_after, 1),
                round(lags[-1], 3),
                round(lags[len(lags) // 2], 3),
                round(max(s.hog.write_waits, default=0.0), 2),
                s.hog.passes,
            )
    finally:
        with contextlib.suppress(Exception):
            await admin.delete(NAMESPACE, ns)


def _table(runs: Sequence[Run]) -> str:
    lines = [
        "| elector | load | runs | lost (of runs) | renewal round s (min/med/max) | gap between renewals s "
        "(min/med/max) | loop lag s (med of medians / max) | shared client max wait s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arrangement in ("in-loop", "thread"):
        for saturated in (False, True):
            group = [r for r in runs if r.arrangement == arrangement and r.saturated == saturated]
            if not group:
                continue
            rounds = summarize([x for r in group for x in r.rounds_s], digits=3)
            gaps = summarize([x for r in group for x in r.gaps_s], digits=2)
            lost = [r.lost_after_s for r in group if r.lost_after_s is not None]
            lost_text = f"{len(lost)} (after {', '.join(f'{x:.0f}' for x in lost)} s)" if lost else "0"
            lag_p50 = sorted(r.loop_lag_p50_s for r in group)[len(group) // 2]
            lines.append(
                f"| {arrangement} | {'saturated' if saturated else 'idle'} | {len(group)} | {lost_text} | "
                f"{rounds['min']}/{rounds['p50']}/{rounds['max']} | {gaps['min']}/{gaps['p50']}/{gaps['max']} | "
                f"{lag_p50}/{max(r.loop_lag_max_s for r in group)} | "
                f"{max(r.shared_client_wait_max_s for r in group)} |"
            )
    return "\n".join(lines)


async def measure(runs: int, seconds: float, load: Load) -> dict[str, Any]:
    cluster = DevCluster.up(ClusterConfig(name=f"lease-bench-{uuid.uuid4().hex[:6]}", nodes=1))
    results: list[Run] = []
    try:
        async with await ApiClient.from_kubeconfig(str(cluster.kubeconfig)) as admin:
            for i in range(runs):
                for arrangement in ("in-loop", "thread"):
                    for saturate in (False, True):
                        this = Load(**{**asdict(load), "saturate": saturate})
                        log(f"run {i + 1}/{runs}: {arrangement}, {'saturated' if saturate else 'idle'}")
                        results.append(await _one(cluster, admin, arrangement, this, seconds))
    finally:
        cluster.down(quiet=True)
    return {
        "benchmark": "lease-saturation",
        "params": {"runs": runs, "seconds": seconds, "load": asdict(load)},
        "host": host_info(),
        "runs": [asdict(r) for r in results],
        "table": _table(results),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="observation window per run")
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.runs, args.seconds, Load()))
    path = write_result("lease-saturation", report)
    print(report["table"])
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    raise SystemExit(main())
