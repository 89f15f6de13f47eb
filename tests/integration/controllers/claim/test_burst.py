"""200 concurrent claims against a warm pool of 100, with and without a SIGKILL of the controller mid-burst.

Real control plane and the real `agent-sandbox-controller --extensions` process; no mocks. Invariants
(controllers spec §4.6 "concurrency properties", §3.11):

* exactly 100 claims are warm (each adopted one of the 100 members that were Ready before the burst) and
  100 are cold (each got a Sandbox named like itself);
* no Sandbox is referenced by two claims, and every claim controls exactly one Sandbox;
* the pool created exactly 100 + 100 Sandboxes: the initial fill plus one refill per adopted member
  (counted from a watch of Sandbox creations that starts before the pool exists).

To make "exactly 100 warm" deterministic, every node is cordoned once the pool is Ready: refills and cold
Sandboxes then get no Pod IP until the burst is over, so a refill can never be adopted by a late claim
(otherwise the count of warm claims would depend on timing). Nodes are uncordoned before the final checks,
which then also wait for the pool to be whole again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import controller_ref
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import CONTROLLER, start_controller
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.devcluster.rest import probe_http
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    ApiClient,
    Object,
)
from tests import helpers
from tests.helpers import CreationLog, is_ready
from tests.integration.controllers.builders import EXT, create_template_and_pool, pool_members

pytestmark = pytest.mark.integration

POOL_SIZE = 100
CLAIMS = 200


def launch(cluster: DevCluster) -> Started:
    return start_controller(cluster)


def relaunch(cluster: DevCluster, dead: Started) -> Started:
    """Start the controller again with the dead process's exact argv and webhook URL.

    `start_controller` would re-apply the CRDs and give the webhook a new port; either changes the CRDs,
    which makes the API server rebuild their watch caches and expire every open watch (410), including
    the creation log's. Same argv, same URL: the start-up CRD patch is a no-op, as after a real crash.
    """
    argv = dead_argv[dead.pid]
    health = next(a.split(":")[-1] for a in argv if a.startswith("--health-probe-bind-address="))
    started = cluster.add_process(CONTROLLER, argv, env=dead_env[dead.pid])
    deadline = time.monotonic() + 60
    while not probe_http(f"http://127.0.0.1:{health}/readyz"):
        assert is_ours(started.pid, started.exe), "restarted controller exited"
        assert time.monotonic() < deadline, "restarted controller not ready"
        time.sleep(0.1)
    return started


dead_argv: dict[int, list[str]] = {}
dead_env: dict[int, dict[str, str]] = {}


def remember_launch(started: Started) -> None:
    """Record a live process's argv and webhook URL (from /proc) so `relaunch` can repeat them."""
    raw = Path(f"/proc/{started.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    dead_argv[started.pid] = [a.decode() for a in raw]
    environ = Path(f"/proc/{started.pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
    dead_env[started.pid] = {k: v for k, v in env.items() if k.startswith("AGENT_SANDBOX_")}


@contextlib.contextmanager
def cordoned(cluster: DevCluster) -> Iterator[Callable[[], None]]:
    """Cordon every node; yields a function that uncordons them early (always uncordoned on exit)."""
    nodes = list(cluster.state.nodes)
    for node in nodes:
        cluster.cordon_node(node)
    done = False

    def release() -> None:
        nonlocal done
        if not done:
            for node in nodes:
                cluster.cordon_node(node, cordoned=False)
            done = True

    try:
        yield release
    finally:
        release()


eventually = functools.partial(helpers.eventually, within=240.0)


async def start_pool(kube: ApiClient, ns: str) -> set[str]:
    """Template + pool of 100; returns the names of the 100 members once all are Ready."""
    await create_template_and_pool(kube, ns, replicas=POOL_SIZE)

    async def all_ready() -> set[str] | None:
        members = await pool_members(kube, ns)
        names = {m["metadata"]["name"] for m in members if is_ready(m)}
        return names if len(names) == POOL_SIZE else None

    return await eventually(all_ready, f"{POOL_SIZE} Ready pool members")


async def create_claims(kube: ApiClient, ns: str, names: list[str]) -> None:
    gate = asyncio.Semaphore(50)

    async def one(name: str) -> None:
        body = {
            "apiVersion": EXT,
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"warmPoolRef": {"name": "pool"}},
        }
        async with gate:
            await kube.create(SANDBOX_CLAIM, body, namespace=ns)

    await asyncio.gather(*(one(n) for n in names))


async def bound_count(kube: ApiClient, ns: str) -> int:
    claims = await kube.list(SANDBOX_CLAIM, namespace=ns)
    return sum(1 for cl in claims if ((cl.get("status") or {}).get("sandbox") or {}).get("name"))


async def check_invariants(kube: ApiClient, ns: str, members: set[str], log: CreationLog) -> None:
    async def settled() -> tuple[list[Object], list[Object]] | None:
        claims = await kube.list(SANDBOX_CLAIM, namespace=ns)
        sandboxes = await kube.list(SANDBOX, namespace=ns)
        pool_ready = [
            s
            for s in sandboxes
            if is_ready(s) and c.LABEL_WARM_POOL_SANDBOX in (s["metadata"].get("labels") or {})
        ]
        all_ready = len(claims) == CLAIMS and all(is_ready(cl) for cl in claims)
        return (claims, sandboxes) if all_ready and len(pool_ready) == POOL_SIZE else None

    claims, sandboxes = await eventually(settled, "every claim Ready and the pool whole again")
    by_name = {s["metadata"]["name"]: s for s in sandboxes}
    referenced = [cl["status"]["sandbox"]["name"] for cl in claims]
    assert len(set(referenced)) == CLAIMS, "a Sandbox is referenced by two claims"
    owners = Counter()
    for cl in claims:
        sb = by_name[cl["status"]["sandbox"]["name"]]
        ref = controller_ref(sb["metadata"])
        assert ref is not None
        assert (ref["kind"], ref["uid"]) == ("SandboxClaim", cl["metadata"]["uid"])
    for sb in sandboxes:
        ref = controller_ref(sb["metadata"])
        if ref is not None and ref["kind"] == "SandboxClaim":
            owners[ref["name"]] += 1
    assert set(owners.values()) == {1}, (
        f"claims owning more than one Sandbox: {[n for n, k in owners.items() if k > 1]}"
    )
    assert len(owners) == CLAIMS
    launch = Counter(by_name[n]["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] for n in referenced)
    assert launch == {"warm": POOL_SIZE, "cold": CLAIMS - POOL_SIZE}
    warm = {n for n in referenced if by_name[n]["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] == "warm"}
    assert warm == members  # every pre-burst member was adopted, and only those
    cold = {cl["metadata"]["name"] for cl in claims} & set(referenced)
    assert len(cold) == CLAIMS - POOL_SIZE  # cold Sandboxes are named like their claims
    pool_created = {n for n in log.added if n.startswith("pool-")}
    assert len(pool_created) == POOL_SIZE + POOL_SIZE, f"pool created {len(pool_created)} Sandboxes"


async def test_200_claims_against_a_pool_of_100(cluster: DevCluster, kube: ApiClient, namespace: str) -> None:
    ns = namespace
    controller = launch(cluster)  # also installs the CRDs
    try:
        async with CreationLog(kube, ns) as log:
            members = await start_pool(kube, ns)
            with cordoned(cluster) as uncordon:
                await create_claims(kube, ns, [f"c-{i:03d}" for i in range(CLAIMS)])
                await eventually(lambda: _ge(bound_count(kube, ns), CLAIMS), "every claim bound")
                uncordon()
                await check_invariants(kube, ns, members, log)
    finally:
        stop(controller)


async def test_200_claims_survive_a_sigkill_mid_burst(
    cluster: DevCluster, kube: ApiClient, namespace: str
) -> None:
    ns = namespace
    procs = [launch(cluster)]
    try:
        async with CreationLog(kube, ns) as log:
            members = await start_pool(kube, ns)
            with cordoned(cluster) as uncordon:
                await create_claims(kube, ns, [f"c-{i:03d}" for i in range(CLAIMS // 2)])
                bound_before = await eventually(
                    lambda: _ge(bound_count(kube, ns), 10), "the first claims bound"
                )
                first = procs[0]
                remember_launch(first)
                assert is_ours(first.pid, first.exe)
                os.kill(first.pid, signal.SIGKILL)  # no drain, no graceful shutdown
                stop(first)  # reaps it (by PID)
                bound_at_kill = await bound_count(kube, ns)
                assert bound_before <= bound_at_kill < CLAIMS
                print(f"SIGKILL with {bound_at_kill}/{CLAIMS // 2} claims of the first half bound")
                # The rest of the burst arrives while no controller runs; then a new process takes over.
                await create_claims(kube, ns, [f"c-{i:03d}" for i in range(CLAIMS // 2, CLAIMS)])
                procs.append(relaunch(cluster, first))
                await eventually(
                    lambda: _ge(bound_count(kube, ns), CLAIMS), "every claim bound after the restart"
                )
                uncordon()
                await check_invariants(kube, ns, members, log)
    finally:
        for proc in procs:
            stop(proc)


async def _ge(value: Awaitable[int], want: int) -> int | None:
    got = await value
    return got if got >= want else None
