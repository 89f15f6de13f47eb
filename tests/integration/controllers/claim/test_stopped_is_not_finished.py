"""A claimed Sandbox whose Pod is stopped from outside - a suspend, or a delete of the Pod by a user or an
eviction - has not finished, on the real control plane with the real controller process.

Graceful deletion takes the Pod through phase Failed (a kubelet reports it so; kwok's pod-terminated stage
models it, exit 137). The Sandbox controller used to set Finished=True/PodFailed from that Pod, the claim
mirrored it, and a claim with `ttlSecondsAfterFinished: 0` expired: its Sandbox and the Sandbox's PVCs were
deleted (probe p2, defect 1; the departure from spec §1.9.3 is in docs/lifecycle.md). And an expired claim
keeps its Finished while its Sandbox terminates (defect 2).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SANDBOX_CLAIM,
    ApiClient,
    NotFound,
    Object,
    ServerError,
    TransportError,
)
from tests.helpers import eventually
from tests.integration.controllers.builders import claim_body, create_template_and_pool, template_body

pytestmark = pytest.mark.integration

_FINAL = ("PodFailed", "PodSucceeded")

VCT = [
    {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
]
HOLD = "test.agents.x-k8s.io/hold"
MARKER_IP = "10.255.0.1"


async def maybe(kube: ApiClient, kind: Any, name: str, ns: str) -> Object | None:
    try:
        return await kube.get(kind, name, namespace=ns)
    except NotFound:
        return None


def condition(obj: Object | None, type_: str) -> tuple[str, str, str] | None:
    for cd in ((obj or {}).get("status") or {}).get("conditions") or ():
        if cd["type"] == type_:
            return (cd["status"], cd.get("reason", ""), cd.get("message", ""))
    return None


@contextlib.asynccontextmanager
async def versions(kube: ApiClient, kind: Any, obj: Object) -> AsyncIterator[list[Object]]:
    """Every version of `obj` written after the one given, in order, while the block runs."""
    seen: list[Object] = []
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]

    async def record() -> None:
        rv = obj["metadata"]["resourceVersion"]
        while True:
            stream = kube.watch(
                kind, namespace=ns, field_selector=f"metadata.name={name}", resource_version=rv
            )
            try:
                async for event in stream:
                    rv = event.object["metadata"]["resourceVersion"]
                    if event.type != "BOOKMARK":
                        seen.append(event.object)
            except (ServerError, TransportError):
                # A loaded API server may drop the stream: resume from the last version seen.
                await asyncio.sleep(0.1)

    task = asyncio.create_task(record())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _ready_claim(kube: ApiClient, ns: str) -> Object:
    async def probe() -> Object | None:
        claim = await maybe(kube, SANDBOX_CLAIM, "c", ns)
        return claim if (condition(claim, "Ready") or ("",))[0] == "True" else None

    return await eventually(probe, "claim Ready", within=90)


@pytest.mark.parametrize("stop", ["suspend", "pod-deleted"])
async def test_a_stopped_pod_does_not_finish_the_sandbox_nor_expire_its_claim(
    kube: ApiClient, namespace: str, controller: Started, stop: str
) -> None:
    ns = namespace
    await create_template_and_pool(kube, ns, replicas=1, template=template_body(volumeClaimTemplates=VCT))
    await kube.create(SANDBOX_CLAIM, claim_body("c", lifecycle={"ttlSecondsAfterFinished": 0}), namespace=ns)
    name = (await _ready_claim(kube, ns))["status"]["sandbox"]["name"]
    pvc_uid = (await kube.get(PVC, f"data-{name}", namespace=ns))["metadata"]["uid"]
    pod_uid = (await kube.get(POD, name, namespace=ns))["metadata"]["uid"]
    sandbox = await kube.get(SANDBOX, name, namespace=ns)

    async with versions(kube, SANDBOX, sandbox) as seen:
        if stop == "suspend":
            await kube.patch(SANDBOX, name, {"spec": {"operatingMode": "Suspended"}}, namespace=ns)
        else:
            await kube.delete(POD, name, namespace=ns)

        async def settled() -> tuple[Object | None] | None:
            # The end state, or the Sandbox gone (the old behaviour: the claim expired and deleted it).
            sb = await maybe(kube, SANDBOX, name, ns)
            if sb is None:
                return (None,)
            if stop == "suspend":
                done = (condition(sb, "Suspended") or ("",))[0] == "True"
            else:
                pod = await maybe(kube, POD, name, ns)
                fresh = pod is not None and pod["metadata"]["uid"] != pod_uid
                done = fresh and (condition(sb, "Ready") or ("",))[0] == "True"
            return (sb,) if done else None

        (sb,) = await eventually(settled, f"the Sandbox settled after the {stop}", within=90)

    finished = [condition(v, "Finished") for v in seen if condition(v, "Finished") is not None]
    assert finished == [], f"the stopped Pod set Finished on the Sandbox: {finished}"
    # Nor a Ready reason clients take as final (upstream's SDK among them) while the Pod is recreated.
    final = [condition(v, "Ready") for v in seen if (condition(v, "Ready") or ("", ""))[1] in _FINAL]
    assert final == [], f"the stopped Pod gave the Sandbox a final Ready: {final}"
    assert sb is not None, "the Sandbox was deleted"
    assert (await kube.get(PVC, f"data-{name}", namespace=ns))["metadata"]["uid"] == pvc_uid

    async def claim_follows() -> Object | None:
        claim = await maybe(kube, SANDBOX_CLAIM, "c", ns)
        want = "Sandbox is suspended" if stop == "suspend" else "Pod is Ready"
        return claim if want in (condition(claim, "Ready") or ("", "", ""))[2] else None

    claim = await eventually(claim_follows, "the claim mirrors the Sandbox's Ready", within=60)
    assert condition(claim, "Finished") is None
    assert claim["status"]["sandbox"]["name"] == name


async def test_an_expired_claim_keeps_finished_and_its_sandbox_while_the_sandbox_terminates(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    """Spec §4.9 step 5: an expired claim keeps Finished and never binds another Sandbox (probe p2, defect 2).

    The Sandbox being torn down can lose its own Finished before it is gone (it had lost it when its Pod
    went). Here a finalizer holds the deleted Sandbox and the test removes its Finished - in the same status
    write as a marker address, so the claim's mirrored address shows when the claim has seen that version.
    The claim used to drop its Finished, un-expire, and bind the pool's fresh member.
    """
    ns = namespace
    pod = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
    await create_template_and_pool(kube, ns, replicas=1, template=template_body(pod=pod))
    await kube.create(SANDBOX_CLAIM, claim_body("c", lifecycle={"ttlSecondsAfterFinished": 0}), namespace=ns)
    name = (await _ready_claim(kube, ns))["status"]["sandbox"]["name"]
    await kube.patch(SANDBOX, name, {"metadata": {"finalizers": [HOLD]}}, namespace=ns)
    try:
        # The workload ends on its own (kwok's pod-exit stage): Finished, the claim expires, Retain deletes.
        exit_now = {"metadata": {"annotations": {"devcluster.agents.x-k8s.io/exit-code": "0"}}}
        await kube.patch(POD, name, exit_now, namespace=ns)

        async def terminating() -> Object | None:
            sb = await kube.get(SANDBOX, name, namespace=ns)
            return sb if sb["metadata"].get("deletionTimestamp") else None

        sb = await eventually(terminating, "the expired claim deletes its Sandbox", within=60)
        claim = await kube.get(SANDBOX_CLAIM, "c", namespace=ns)
        assert (condition(claim, "Ready") or ("", ""))[1] == "ClaimExpired", (claim["status"], sb["status"])
        assert condition(claim, "Finished") is not None

        without = [cd for cd in sb["status"]["conditions"] if cd["type"] != "Finished"]
        marker = {"status": {"conditions": without, "podIPs": [MARKER_IP]}}
        await kube.patch(SANDBOX, name, marker, namespace=ns, subresource="status")

        async def seen() -> Object | None:
            claim = await kube.get(SANDBOX_CLAIM, "c", namespace=ns)
            ref = claim["status"].get("sandbox") or {}
            return claim if ref.get("name") != name or ref.get("podIPs") == [MARKER_IP] else None

        claim = await eventually(
            seen, "the claim mirrors the terminating Sandbox's marker address", within=60
        )
        assert claim["status"]["sandbox"]["name"] == name
        assert (condition(claim, "Ready") or ("", ""))[1] == "ClaimExpired"
        assert condition(claim, "Finished") is not None
    finally:
        await kube.patch(SANDBOX, name, {"metadata": {"finalizers": None}}, namespace=ns)

    async def unbound() -> Object | None:
        claim = await kube.get(SANDBOX_CLAIM, "c", namespace=ns)
        return claim if (claim["status"].get("sandbox") or {}).get("name") != name else None

    claim = await eventually(unbound, "the claim lets go of its deleted Sandbox", within=60)
    assert "sandbox" not in claim["status"], f"the expired claim bound another Sandbox: {claim['status']}"
    assert (condition(claim, "Ready") or ("", ""))[1] == "ClaimExpired"
    assert condition(claim, "Finished") is not None
    uid = claim["metadata"]["uid"]
    owned = [
        sb["metadata"]["name"]
        for sb in await kube.list(SANDBOX, namespace=ns)
        if any(ref.get("uid") == uid for ref in sb["metadata"].get("ownerReferences") or ())
    ]
    assert owned == []


async def test_a_claim_expired_by_its_shutdown_time_revives_when_it_moves_later(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    """Spec §4.9: the claim keeps its Finished while expired (above), yet moving `shutdownTime` later still
    revives it - it binds a new Sandbox and its old Finished (the TTL's start) goes in the same pass."""
    ns = namespace
    pod = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
    await create_template_and_pool(kube, ns, replicas=1, template=template_body(pod=pod))
    lifecycle = {"ttlSecondsAfterFinished": 3600, "shutdownPolicy": "Retain"}
    await kube.create(SANDBOX_CLAIM, claim_body("c", lifecycle=lifecycle), namespace=ns)
    name = (await _ready_claim(kube, ns))["status"]["sandbox"]["name"]
    exit_now = {"metadata": {"annotations": {"devcluster.agents.x-k8s.io/exit-code": "0"}}}
    await kube.patch(POD, name, exit_now, namespace=ns)

    async def finished() -> Object | None:
        claim = await maybe(kube, SANDBOX_CLAIM, "c", ns)
        return claim if condition(claim, "Finished") is not None else None

    await eventually(finished, "the claim mirrors Finished", within=60)
    past = {"spec": {"lifecycle": {**lifecycle, "shutdownTime": "2000-01-01T00:00:00Z"}}}
    await kube.patch(SANDBOX_CLAIM, "c", past, namespace=ns)

    async def expired() -> Object | None:
        claim = await maybe(kube, SANDBOX_CLAIM, "c", ns)
        gone = await maybe(kube, SANDBOX, name, ns) is None
        return claim if gone and (condition(claim, "Ready") or ("", ""))[1] == "ClaimExpired" else None

    claim = await eventually(expired, "the claim expires and Retain deletes its Sandbox", within=60)
    assert condition(claim, "Finished") is not None  # kept while expired (§4.9 step 5)

    later = {"spec": {"lifecycle": {**lifecycle, "shutdownTime": "2999-01-01T00:00:00Z"}}}
    await kube.patch(SANDBOX_CLAIM, "c", later, namespace=ns)
    claim = await _ready_claim(kube, ns)
    assert claim["status"]["sandbox"]["name"] != name
    assert condition(claim, "Finished") is None
