"""SandboxWarmPool controller on a real control plane (controllers spec §3): sizing, /scale, rollouts, GC.

The real `agent-sandbox-controller --extensions` process (Sandbox controller included: it turns members
into Pods, kwok makes them Ready) runs against the session's local control plane; no mocks. A short
readiness grace period and recheck interval are set through the process flags so stuck and unschedulable
members are handled within seconds.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import (
    EVENT,
    NETWORK_POLICY,
    POD,
    SANDBOX,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    NotFound,
    Object,
)
from tests import helpers
from tests.helpers import is_ready
from tests.integration.controllers.builders import EXT, pool_body, pool_members, template_body

pytestmark = pytest.mark.integration

TEAM = {"team": "a"}
GRACE = 6  # seconds: --sandbox-warm-pool-readiness-grace-period
RECHECK = 2  # seconds: --sandbox-warm-pool-unschedulable-recheck-interval


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(
        cluster,
        extra=(
            f"--sandbox-warm-pool-readiness-grace-period={GRACE}s",
            f"--sandbox-warm-pool-unschedulable-recheck-interval={RECHECK}s",
        ),
    )
    try:
        yield started
    finally:
        stop(started)


eventually = functools.partial(helpers.eventually, within=90.0)


async def settled(kube: ApiClient, ns: str, pool: str, n: int) -> list[Object] | None:
    """n Ready, non-terminating members and a status that says so (observed at the current generation)."""
    live = [m for m in await pool_members(kube, ns, pool) if not m["metadata"].get("deletionTimestamp")]
    if len(live) != n or not all(is_ready(m) for m in live):
        return None
    p = await kube.get(SANDBOX_WARM_POOL, pool, namespace=ns)
    st = p.get("status") or {}
    if (st.get("replicas"), st.get("readyReplicas"), st.get("observedGeneration")) != (
        n,
        n,
        p["metadata"]["generation"],
    ):
        return None
    return live


async def test_pool_of_five_ready_members_with_the_member_shape(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    await kube.create(SANDBOX_TEMPLATE, template_body(labels=TEAM), namespace=ns)
    pool = await kube.create(SANDBOX_WARM_POOL, pool_body("pool", 5), namespace=ns)
    live = await eventually(lambda: settled(kube, ns, "pool", 5), "5 Ready members")

    p = await kube.get(SANDBOX_WARM_POOL, "pool", namespace=ns)
    assert p["status"]["selector"] == f"agents.x-k8s.io/warm-pool-sandbox={naming.name_hash('pool')}"
    for sb in live:
        meta = sb["metadata"]
        assert meta["name"].startswith("pool-")
        assert meta["ownerReferences"] == [
            {
                "apiVersion": EXT,
                "kind": "SandboxWarmPool",
                "name": "pool",
                "uid": pool["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = meta["labels"]
        assert labels[c.LABEL_SANDBOX_TEMPLATE_REF_HASH] == naming.name_hash("tmpl")
        assert labels[c.LABEL_LAUNCH_TYPE] == "warm"
        assert labels[c.LABEL_CREATED_BY] == "controller"
        assert len(labels[c.LABEL_SANDBOX_TEMPLATE_HASH]) == 8
        assert meta["annotations"][c.ANNOTATION_SANDBOX_TEMPLATE_REF] == "tmpl"
        pod_template = sb["spec"]["podTemplate"]
        assert pod_template["metadata"]["annotations"][c.ANNOTATION_SAFE_TO_EVICT] == "true"
        assert pod_template["spec"]["automountServiceAccountToken"] is False
        assert pod_template["spec"]["dnsPolicy"] == "None"
    # The status selector also selects the members' Pods (what an HPA reads metrics from).
    pods = await kube.list(POD, namespace=ns, label_selector=p["status"]["selector"])
    assert sorted(pod["metadata"]["name"] for pod in pods) == sorted(sb["metadata"]["name"] for sb in live)
    assert all(pod["spec"].get("automountServiceAccountToken") is False for pod in pods)
    # The template's shared NetworkPolicy selects those Pods by the template ref-hash label.
    pol = await eventually(lambda: _get(kube, NETWORK_POLICY, "tmpl-network-policy", ns), "the NetworkPolicy")
    assert pol["spec"]["podSelector"]["matchLabels"] == {
        c.LABEL_SANDBOX_TEMPLATE_REF_HASH: naming.name_hash("tmpl")
    }
    assert all(
        pod["metadata"]["labels"].get(c.LABEL_SANDBOX_TEMPLATE_REF_HASH) == naming.name_hash("tmpl")
        for pod in pods
    )


async def test_scale_through_spec_and_the_scale_subresource(
    kube: ApiClient, cluster: DevCluster, namespace: str, controller: Started
) -> None:
    ns = namespace
    await kube.create(SANDBOX_TEMPLATE, template_body(labels=TEAM), namespace=ns)
    await kube.create(SANDBOX_WARM_POOL, pool_body("pool", 2), namespace=ns)
    await eventually(lambda: settled(kube, ns, "pool", 2), "2 Ready members")

    await kube.patch(SANDBOX_WARM_POOL, "pool", {"spec": {"replicas": 6}}, namespace=ns)
    await eventually(lambda: settled(kube, ns, "pool", 6), "scale up to 6")

    # The scale subresource, as an HPA or `kubectl scale` drives it.
    scale = await kube.get(SANDBOX_WARM_POOL, "pool", namespace=ns, subresource="scale")
    assert scale["spec"]["replicas"] == 6
    assert scale["status"]["replicas"] == 6
    assert scale["status"]["selector"] == f"agents.x-k8s.io/warm-pool-sandbox={naming.name_hash('pool')}"
    await kube.patch(SANDBOX_WARM_POOL, "pool", {"spec": {"replicas": 3}}, namespace=ns, subresource="scale")
    await eventually(lambda: settled(kube, ns, "pool", 3), "scale down to 3 through /scale")
    out = cluster.kubectl("scale", "-n", ns, "sandboxwarmpool/pool", "--replicas=4")
    assert out.returncode == 0, out.stderr
    await eventually(lambda: settled(kube, ns, "pool", 4), "kubectl scale to 4")
    await kube.patch(SANDBOX_WARM_POOL, "pool", {"spec": {"replicas": 0}}, namespace=ns, subresource="scale")

    async def empty() -> bool:
        p = await kube.get(SANDBOX_WARM_POOL, "pool", namespace=ns)
        return not await pool_members(kube, ns, "pool") and p.get("status", {}).get("replicas") == 0

    await eventually(empty, "an empty pool with status.replicas written as 0")


async def test_template_change_recreate_versus_on_replenish(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    await kube.create(SANDBOX_TEMPLATE, template_body(image="busybox:1", labels=TEAM), namespace=ns)
    await kube.create(SANDBOX_WARM_POOL, pool_body("recreate", 2, strategy="Recreate"), namespace=ns)
    await kube.create(SANDBOX_WARM_POOL, pool_body("replenish", 2), namespace=ns)
    old_recreate = await eventually(lambda: settled(kube, ns, "recreate", 2), "Recreate pool Ready")
    old_replenish = await eventually(lambda: settled(kube, ns, "replenish", 2), "OnReplenish pool Ready")
    old_hash = old_recreate[0]["metadata"]["labels"][c.LABEL_SANDBOX_TEMPLATE_HASH]

    # A metadata-only edit never recreates anything.
    await kube.patch(
        SANDBOX_TEMPLATE,
        "tmpl",
        {"spec": {"podTemplate": {"metadata": {"labels": {"extra": "1"}}}}},
        namespace=ns,
    )
    # A real change (image) does, but only under Recreate.
    patch = {"spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}}}
    await kube.patch(SANDBOX_TEMPLATE, "tmpl", patch, namespace=ns)

    async def recreated() -> list[Object] | None:
        live = await settled(kube, ns, "recreate", 2)
        if not live or any(
            m["spec"]["podTemplate"]["spec"]["containers"][0]["image"] != "busybox:2" for m in live
        ):
            return None
        return live

    fresh = await eventually(recreated, "Recreate pool rolled to the new image")
    assert {m["metadata"]["uid"] for m in fresh}.isdisjoint({m["metadata"]["uid"] for m in old_recreate})
    assert all(m["metadata"]["labels"][c.LABEL_SANDBOX_TEMPLATE_HASH] != old_hash for m in fresh)

    kept = await settled(kube, ns, "replenish", 2)
    assert kept is not None
    assert {m["metadata"]["uid"] for m in kept} == {m["metadata"]["uid"] for m in old_replenish}
    # OnReplenish: a member that leaves is replaced from the current template.
    gone = old_replenish[0]["metadata"]["name"]
    await kube.delete(SANDBOX, gone, namespace=ns)

    async def replenished() -> list[Object] | None:
        live = await settled(kube, ns, "replenish", 2)
        if not live or gone in {m["metadata"]["name"] for m in live}:
            return None
        return live

    live = await eventually(replenished, "OnReplenish replacement")
    images = sorted(m["spec"]["podTemplate"]["spec"]["containers"][0]["image"] for m in live)
    assert images == ["busybox:1", "busybox:2"]


async def test_stuck_members_are_replaced_after_the_grace_period(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    # The container exits at once (devcluster pod-exit stage): the Pod is scheduled but fails, so the
    # member never becomes Ready and is replaced once older than the grace period.
    pod = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["false"]}],
    }
    tmpl = template_body(labels=TEAM, pod=pod)
    await kube.create(SANDBOX_TEMPLATE, tmpl, namespace=ns)
    await kube.create(SANDBOX_WARM_POOL, pool_body("pool", 2), namespace=ns)

    first = await eventually(lambda: _count(pool_members(kube, ns, "pool"), 2), "2 members")
    first_uids = {m["metadata"]["uid"] for m in first}

    async def replaced() -> bool:
        live = await pool_members(kube, ns, "pool")
        return len(live) >= 1 and first_uids.isdisjoint({m["metadata"]["uid"] for m in live})

    await eventually(replaced, "stuck members replaced", within=GRACE * 6 + 30)
    # Never more than spec.replicas live members at any time we look.
    for _ in range(10):
        live = [m for m in await pool_members(kube, ns, "pool") if not m["metadata"].get("deletionTimestamp")]
        assert len(live) <= 2
        await asyncio.sleep(0.3)
    await kube.patch(SANDBOX_WARM_POOL, "pool", {"spec": {"replicas": 0}}, namespace=ns)


async def test_unschedulable_members_are_held_with_a_not_progressing_event(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    big = template_body(labels=TEAM)
    big["spec"]["podTemplate"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "64"}}
    await kube.create(SANDBOX_TEMPLATE, big, namespace=ns)
    await kube.create(SANDBOX_WARM_POOL, pool_body("pool", 2, strategy="Recreate"), namespace=ns)
    held = await eventually(lambda: _count(pool_members(kube, ns, "pool"), 2), "2 members")
    held_uids = {m["metadata"]["uid"] for m in held}

    async def not_progressing() -> list[Object] | None:
        evs = await pool_events(kube, ns, "pool")
        return [e for e in evs if e["reason"] == "WarmPoolNotProgressing"] or None

    (event,) = await eventually(not_progressing, "the WarmPoolNotProgressing event", within=GRACE * 4 + 30)
    assert event["type"] == "Warning"
    assert event["action"] == "Reconciling"
    assert event["reportingController"] == "sandboxwarmpool-controller"
    # The Event is written on entering the state, with the count at that pass: the two members' grace
    # deadlines (and the scheduler's PodScheduled=False) can land in different passes, so 1/2 is as right as 2/2.
    assert event["note"] in {
        f"{u}/2 sandboxes are unschedulable past the {GRACE}s readiness grace period; holding them instead of "
        "replacing (replacements would be equally unschedulable)"
        for u in (1, 2)
    }
    # Held, not churned: after several recheck intervals the same two members are still there.
    await asyncio.sleep(RECHECK * 3)
    assert {m["metadata"]["uid"] for m in await pool_members(kube, ns, "pool")} == held_uids
    assert len(await not_progressing() or []) == 1  # no repeat while the state persists

    # A schedulable template (Recreate) replaces them; once Ready the pool is progressing again.
    await kube.patch(
        SANDBOX_TEMPLATE,
        "tmpl",
        {"spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}}},
        namespace=ns,
    )
    await eventually(lambda: settled(kube, ns, "pool", 2), "schedulable replacements Ready")

    async def progressing() -> bool:
        return any(e["reason"] == "WarmPoolProgressing" for e in await pool_events(kube, ns, "pool"))

    await eventually(progressing, "the WarmPoolProgressing event")


async def pool_events(kube: ApiClient, ns: str, pool: str) -> list[Object]:
    return [e for e in await kube.list(EVENT, namespace=ns) if (e.get("regarding") or {}).get("name") == pool]


async def _count(items: Awaitable[list[Object]], n: int) -> list[Object] | None:
    got = await items
    return got if len(got) == n else None


async def _get(kube: ApiClient, kind: Any, name: str, ns: str) -> Object | None:
    try:
        return await kube.get(kind, name, namespace=ns)
    except NotFound:
        return None
