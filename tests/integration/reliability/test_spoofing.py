"""Reserved labels and annotations set by a user are ineffective (threat model: label spoofing).

Real control plane and the real controller. A victim claim is bound to a warm Sandbox; then, in the same
namespace, a user tries to take it or its traffic over by writing the keys only the controller may set:

* a claim whose annotation `agents.x-k8s.io/sandbox-name` (and the deprecated label of the same key) names
  the victim's Sandbox, and whose labels copy the victim's `claim-uid`: it gets a Sandbox of its own, the
  victim's Sandbox stays controlled by and bound to the victim;
* a claim asking for reserved pod labels through `additionalPodMetadata` (`claim-uid`, `sandbox-name-hash`):
  refused with reason InvalidMetadata, nothing created;
* a bare Sandbox whose pod template carries the victim's `sandbox-name-hash` (the Service selector): its pod
  gets its own hash, so the victim's Service never selects it;
* a hand-made Sandbox of another image with the pool's labels but no pool owner: deleted by the pool as
  stale, never adopted by a claim on that pool.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import controller_ref
from agent_sandbox.api.naming import name_hash
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import POD, SANDBOX, SANDBOX_CLAIM, ApiClient, Object
from tests.helpers import eventually, is_ready
from tests.integration.controllers.builders import claim_body, create_template_and_pool, pool_members
from tests.integration.controllers.claim.test_journeys import maybe as get

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)


def reason(obj: Object | None) -> str:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or ():
        if cond["type"] == "Ready":
            return str(cond.get("reason") or "")
    return ""


def bound(claim: Object | None) -> str:
    return str((((claim or {}).get("status") or {}).get("sandbox") or {}).get("name") or "")


async def ready_claim(kube: ApiClient, ns: str, name: str) -> Object:
    async def probe() -> Object | None:
        got = await get(kube, SANDBOX_CLAIM, name, ns)
        return got if got is not None and is_ready(got) and bound(got) else None

    return await eventually(probe, f"claim {name} Ready", within=60)


async def test_reserved_keys_written_by_a_user_are_ineffective(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    await create_template_and_pool(kube, ns, replicas=1)

    async def pool_ready() -> bool:
        return any(is_ready(m) for m in await pool_members(kube, ns))

    await eventually(pool_ready, "a Ready pool member", within=60)
    await kube.create(SANDBOX_CLAIM, claim_body("victim"), namespace=ns)
    victim = await ready_claim(kube, ns, "victim")
    target = bound(victim)
    victim_uid = victim["metadata"]["uid"]

    # 1. A claim pointing its assignment annotation / legacy label at the victim's Sandbox.
    thief = claim_body("thief")
    thief["metadata"]["annotations"] = {c.ANNOTATION_SANDBOX_NAME: target}
    thief["metadata"]["labels"] = {c.LABEL_SANDBOX_NAME_LEGACY: target, c.LABEL_CLAIM_UID: victim_uid}
    await kube.create(SANDBOX_CLAIM, thief, namespace=ns)
    # 2. A claim asking for reserved pod labels.
    forger = claim_body("forger", additionalPodMetadata={"labels": {
        c.LABEL_CLAIM_UID: victim_uid, c.LABEL_SANDBOX_NAME_HASH: name_hash(target)}})  # fmt: skip
    await kube.create(SANDBOX_CLAIM, forger, namespace=ns)
    # 3. A bare Sandbox whose pod template carries the victim's Service selector label.
    mallory = {
        "apiVersion": SANDBOX.api_version, "kind": "Sandbox", "metadata": {"name": "mallory"},
        "spec": {"podTemplate": {
            "metadata": {"labels": {c.LABEL_SANDBOX_NAME_HASH: name_hash(target), c.LABEL_CLAIM_UID: victim_uid}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }  # fmt: skip
    await kube.create(SANDBOX, mallory, namespace=ns)

    # 4. A hand-made Sandbox of another image wearing the pool's labels (no pool owner), then a claim on
    #    the pool. (An orphan identical to the template is adopted by the pool, as upstream does: it is
    #    what the pool would have made. One that differs is stale: deleted, never handed to a claim.)
    async def owned_member() -> Any:  # the victim's claim took one; its replacement may not exist yet
        return next((m for m in await pool_members(kube, ns) if controller_ref(m["metadata"])), None)

    member = await eventually(owned_member, "a pool member the pool owns")
    spec = copy.deepcopy(member["spec"])
    spec["podTemplate"]["spec"]["containers"][0]["image"] = "attacker.example/evil:latest"
    planted = {
        "apiVersion": SANDBOX.api_version, "kind": "Sandbox",
        "metadata": {"name": "planted", "labels": {
            k: v for k, v in member["metadata"]["labels"].items() if k.startswith("agents.x-k8s.io/")}},
        "spec": spec,
    }  # fmt: skip
    await kube.create(SANDBOX, planted, namespace=ns)

    got = await ready_claim(kube, ns, "thief")
    assert bound(got) not in ("", target), bound(got)
    await eventually(lambda: _reason_is(kube, ns, "forger", "InvalidMetadata"), "forger refused", within=60)
    assert await get(kube, SANDBOX, "forger", ns) is None
    await kube.create(SANDBOX_CLAIM, claim_body("late"), namespace=ns)
    late = await ready_claim(kube, ns, "late")
    assert bound(late) != "planted"

    mallory_pod = await eventually(lambda: get(kube, POD, "mallory", ns), "mallory's pod", within=60)
    assert mallory_pod["metadata"]["labels"][c.LABEL_SANDBOX_NAME_HASH] == name_hash("mallory")
    assert mallory_pod["metadata"]["labels"].get(c.LABEL_CLAIM_UID) != victim_uid

    # The victim still holds its Sandbox, and its Service selects only the victim's pod.
    victim = await kube.get(SANDBOX_CLAIM, "victim", namespace=ns)
    assert bound(victim) == target
    sandbox = await kube.get(SANDBOX, target, namespace=ns)
    ref = controller_ref(sandbox["metadata"])
    assert ref is not None
    assert (ref["kind"], ref["uid"]) == ("SandboxClaim", victim_uid)
    selected = await kube.list(
        POD, namespace=ns, label_selector={c.LABEL_SANDBOX_NAME_HASH: name_hash(target)}
    )
    assert [p["metadata"]["name"] for p in selected] == [target]
    await eventually(lambda: _gone(kube, ns, "planted"), "the stale orphan deleted by the pool", within=60)


async def _gone(kube: ApiClient, ns: str, name: str) -> bool:
    return await get(kube, SANDBOX, name, ns) is None


async def _reason_is(kube: ApiClient, ns: str, name: str, want: str) -> bool:
    return reason(await get(kube, SANDBOX_CLAIM, name, ns)) == want
