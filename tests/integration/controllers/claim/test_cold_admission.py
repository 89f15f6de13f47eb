"""Cold-start admission (`--sandbox-claim-cold-start-limit`, docs/design/cold-start-admission.md) on the real cluster.

The real controller with a limit of 2, a pool with no members (every claim is a cold start) and Pods that
take 3 s from scheduling to Ready (the kubelet's part). Watching Sandboxes and reading each one's state
from the stream shows: never more than 2 cold starts between their Sandbox's create and their Pod being
scheduled; more than 2 scheduled-but-not-Ready at once (the kubelet's part holds no slot); Sandboxes created
in the order the claims were (up to the 2 admitted together); every claim Ready; the gauges back at 0 afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from agent_sandbox.api.meta import controller_name, status_condition
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.config import START_AFTER_ANNOTATION
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient
from tests.helpers import controller_metrics, eventually, is_ready
from tests.integration.controllers.builders import claim_body, pool_body, template_body

pytestmark = pytest.mark.integration

LIMIT = 2
CLAIMS = 8


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(cluster, extra=(f"--sandbox-claim-cold-start-limit={LIMIT}",))
    try:
        yield started
    finally:
        stop(started)


def _true(obj: dict[str, object], kind: str) -> bool:
    return (status_condition(obj, kind) or {}).get("status") == "True"


def _gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


async def test_cold_starts_are_bounded_until_scheduled_and_admitted_in_arrival_order(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster
) -> None:
    ns = namespace
    template = template_body()
    template["spec"]["podTemplate"]["metadata"] = {"annotations": {START_AFTER_ANNOTATION: "3000ms"}}
    await kube.create(SANDBOX_TEMPLATE, template, namespace=ns)
    await kube.create(SANDBOX_WARM_POOL, pool_body(replicas=0), namespace=ns)
    start = await kube.list_page(SANDBOX, namespace=ns)
    created: list[str] = []  # claims owning each Sandbox, in create order
    unscheduled: set[str] = set()
    scheduled_not_ready: set[str] = set()
    most_unscheduled = most_starting = 0

    async def follow() -> None:
        nonlocal most_unscheduled, most_starting
        async for ev in kube.watch(SANDBOX, namespace=ns, resource_version=start.resource_version):
            if ev.type not in ("ADDED", "MODIFIED"):
                continue
            name = ev.object["metadata"]["name"]
            if ev.type == "ADDED":
                created.append(controller_name(ev.object, SANDBOX_CLAIM) or "")
            ready = _true(ev.object, "Ready")
            scheduled = ready or _true(ev.object, "PodScheduled")
            (unscheduled.discard if scheduled else unscheduled.add)(name)
            (scheduled_not_ready.add if scheduled and not ready else scheduled_not_ready.discard)(name)
            most_unscheduled = max(most_unscheduled, len(unscheduled))
            most_starting = max(most_starting, len(scheduled_not_ready))

    watcher = asyncio.create_task(follow())
    try:
        names = [f"cold-{i}" for i in range(CLAIMS)]
        for name in names:  # in order, each acknowledged before the next is sent
            await kube.create(SANDBOX_CLAIM, claim_body(name), namespace=ns)

        async def all_ready() -> bool:
            claims = [await kube.get(SANDBOX_CLAIM, n, namespace=ns) for n in names]
            return all(is_ready(c) for c in claims)

        await eventually(all_ready, f"{CLAIMS} cold claims Ready", within=120)

        async def caught_up() -> bool:
            return len(created) == CLAIMS and not unscheduled and not scheduled_not_ready

        await eventually(caught_up, "the watch caught up", within=10)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    # Admitted oldest first; claims admitted together (up to LIMIT) race their creates.
    assert sorted(created) == sorted(names)
    assert all(abs(names.index(owner) - i) < LIMIT for i, owner in enumerate(created)), created
    assert 1 <= most_unscheduled <= LIMIT, f"{most_unscheduled} cold starts before scheduling at once"
    assert most_starting > LIMIT, f"only {most_starting} Pods starting at once: the kubelet's part held slots"
    metrics = controller_metrics(cluster)
    assert _gauge(metrics, "agent_sandbox_claim_cold_starts_in_flight") == 0
    assert _gauge(metrics, "agent_sandbox_claim_cold_starts_waiting") == 0
