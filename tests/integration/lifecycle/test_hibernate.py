"""Deep hibernation on the real control plane: archive, nothing lost, restore by name.

A suspended Sandbox past `hibernate-after` (or asked with `hibernate: "true"`) becomes a SandboxArchive: the
Sandbox object is deleted, its PVC stays (kept alive by the archive), and a restore (`resume` by name)
recreates it with the same name (so the same pod name, hostname and PVC): the file written before is still
there. A claim whose Sandbox is hibernated is neither given a replacement nor marked missing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.cli.lifecycle import NoSuchSandbox, ResumeOutcome, hibernate, resume
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import (
    PVC,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    Object,
)
from tests.helpers import controller_metrics, eventually, is_ready
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.lifecycle.helpers import (
    claim_body,
    execute,
    get_or_none,
    pool_body,
    ready_ip,
    runtime_template,
)

pytestmark = pytest.mark.integration

VCT = [
    {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
]


def pvc_sandbox(name: str, annotations: dict[str, str]) -> Object:
    container = {
        "name": "runtime",
        "image": RUNTIME_IMAGE,
        "volumeMounts": [{"name": "data", "mountPath": "/workspace"}],
    }
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": annotations, "labels": {"team": "blue"}},
        "spec": {"podTemplate": {"spec": {"containers": [container]}}, "volumeClaimTemplates": VCT},
    }


async def archived(kube: ApiClient, ns: str, name: str, within: float = 60) -> Object:
    async def probe() -> Object | None:
        if await get_or_none(kube, SANDBOX, name, ns) is not None:
            return None
        return await get_or_none(kube, lc.ARCHIVE, name, ns)

    return await eventually(probe, f"{name} hibernated", within=within)


def owner_uids(obj: Object, kind: str) -> list[str]:
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or [] if r["kind"] == kind]


async def held_by_sandbox_alone(kube: ApiClient, ns: str, pvc_name: str, sandbox_uid: str) -> Object:
    """The PVC once only the Sandbox holds it: the archive's reference is the garbage collector's to drop
    after the archive is deleted (controllers/lifecycle/owners.py), a moment later."""

    async def probe() -> Object | None:
        pvc = await kube.get(PVC, pvc_name, namespace=ns)
        alone = owner_uids(pvc, "Sandbox") == [sandbox_uid] and not owner_uids(pvc, "SandboxArchive")
        return pvc if alone else None

    return await eventually(probe, f"{pvc_name} held by Sandbox {sandbox_uid} alone", within=30)


async def test_hibernated_then_restored_by_name_with_its_volume(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    await kube.create(SANDBOX, pvc_sandbox("deep", {}), namespace=namespace)
    ip = await ready_ip(kube, namespace, "deep")
    first = await kube.get(SANDBOX, "deep", namespace=namespace)
    async with http.put(f"http://{ip}:8080/v1/files/notes.txt", data=b"kept while hibernated") as resp:
        assert resp.status == 204

    await hibernate(kube, "deep", namespace)
    archive = await archived(kube, namespace, "deep")
    assert archive["spec"]["reason"] == "Requested"
    assert archive["spec"]["sandboxUID"] == first["metadata"]["uid"]
    assert archive["spec"]["children"] == [{"kind": "PersistentVolumeClaim", "name": "data-deep"}]
    assert archive["spec"]["sandbox"]["metadata"]["labels"] == {"team": "blue"}
    assert lc.ANNOTATION_HIBERNATE not in archive["spec"]["sandbox"]["metadata"]["annotations"]

    # The volume outlives the Sandbox object, held by the archive only.
    async def held_by_archive() -> Object | None:
        pvc = await kube.get(PVC, "data-deep", namespace=namespace)
        only_archive = owner_uids(pvc, "SandboxArchive") == [archive["metadata"]["uid"]]
        return pvc if not owner_uids(pvc, "Sandbox") and only_archive else None

    await eventually(held_by_archive, "the PVC held by the archive only")
    assert cluster.volume_path(namespace, "data-deep") is not None

    assert await resume(kube, "deep", namespace, wait=90) is ResumeOutcome.RESTORING
    restored = await kube.get(SANDBOX, "deep", namespace=namespace)
    assert restored["metadata"]["uid"] != first["metadata"]["uid"]
    assert restored["metadata"]["labels"] == {"team": "blue"}
    assert restored["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Manual"
    assert restored["spec"]["operatingMode"] == "Running"
    ip = await ready_ip(kube, namespace, "deep")
    assert (await execute(http, ip, "cat notes.txt"))["stdout"] == "kept while hibernated"
    assert (await execute(http, ip, "sh -c 'echo $HOSTNAME'"))["stdout"] == "deep\n"

    async def settled() -> bool:
        pvc = await kube.get(PVC, "data-deep", namespace=namespace)
        gone = await get_or_none(kube, lc.ARCHIVE, "deep", namespace) is None
        adopted = owner_uids(pvc, "Sandbox") == [restored["metadata"]["uid"]]
        return gone and adopted and not owner_uids(pvc, "SandboxArchive")

    await eventually(settled, "archive deleted and the PVC adopted by the restored Sandbox")
    assert 'agent_sandbox_lifecycle_restores_total{cause="Manual"}' in controller_metrics(cluster)
    with pytest.raises(NoSuchSandbox):
        await resume(kube, "never-existed", namespace)


async def test_idle_then_hibernated_after_the_second_timeout(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster
) -> None:
    annotations = {lc.ANNOTATION_IDLE_TIMEOUT: "2s", lc.ANNOTATION_HIBERNATE_AFTER: "1s"}
    await kube.create(SANDBOX, pvc_sandbox("timed", annotations), namespace=namespace)
    await ready_ip(kube, namespace, "timed")
    archive = await archived(kube, namespace, "timed")
    assert archive["spec"]["reason"] == "HibernateAfter"
    kept = archive["spec"]["sandbox"]["metadata"]["annotations"]
    assert kept[lc.ANNOTATION_SUSPEND_REASON] == "Idle"
    assert kept[lc.ANNOTATION_IDLE_TIMEOUT] == "2s"
    metrics = controller_metrics(cluster)
    assert 'agent_sandbox_lifecycle_hibernations_total{cause="HibernateAfter"}' in metrics
    assert "agent_sandbox_lifecycle_hibernated_sandboxes{namespace=" in metrics


async def test_claimed_sandbox_hibernates_without_a_replacement(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    template = runtime_template(
        "deep-tmpl", annotations={lc.ANNOTATION_IDLE_TIMEOUT: "2s", lc.ANNOTATION_HIBERNATE_AFTER: "1s"}
    )
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body("deep-pool", "deep-tmpl", 1), namespace=namespace)

    async def bound() -> str | None:
        cl = await get_or_none(kube, SANDBOX_CLAIM, "mine", namespace)
        name = (((cl or {}).get("status") or {}).get("sandbox") or {}).get("name")
        return str(name) if cl is not None and is_ready(cl) and name else None

    await kube.create(SANDBOX_CLAIM, claim_body("mine", "deep-pool"), namespace=namespace)
    name = await eventually(bound, "claim Ready", within=90)
    await archived(kube, namespace, name)

    async def hibernated_claim() -> Any:
        cl = await kube.get(SANDBOX_CLAIM, "mine", namespace=namespace)
        ready = next((c for c in cl["status"].get("conditions") or [] if c["type"] == "Ready"), {})
        return cl if ready.get("reason") == "SandboxHibernated" else None

    claim = await eventually(hibernated_claim, "claim Ready=False/SandboxHibernated")
    # Timers off before the restore, so the restored Sandbox is not hibernated again while we look.
    no_timers = {lc.ANNOTATION_IDLE_TIMEOUT: None, lc.ANNOTATION_HIBERNATE_AFTER: None}
    await kube.patch(
        SANDBOX_TEMPLATE, "deep-tmpl", {"metadata": {"annotations": no_timers}}, namespace=namespace
    )
    assert claim["metadata"]["annotations"][lc.ANNOTATION_HIBERNATED_SANDBOX] == name
    # No replacement: the claim controls no Sandbox while hibernated.
    owned = [
        sb
        for sb in await kube.list(SANDBOX, namespace=namespace)
        if any(r.get("name") == "mine" for r in sb["metadata"].get("ownerReferences") or [])
    ]
    assert owned == []
    assert await resume(kube, name, namespace, wait=90) is ResumeOutcome.RESTORING
    assert await eventually(bound, "claim Ready again", within=90) == name

    async def unmarked() -> bool:
        # The restore's last step (after the Sandbox controller has taken the volume back), so it may come
        # after the claim is Ready again: on a loaded machine it did.
        cl = await kube.get(SANDBOX_CLAIM, "mine", namespace=namespace)
        return lc.ANNOTATION_HIBERNATED_SANDBOX not in (cl["metadata"].get("annotations") or {})

    assert await eventually(unmarked, "the claim unmarked", within=60)


async def test_an_expired_hibernated_sandbox_goes_with_its_volume(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    """`shutdownPolicy: Delete` past `shutdownTime` while hibernated: the archive is deleted and the garbage
    collector deletes the PVC it alone kept. Until December 6 a hibernated Sandbox never expired (the archive
    kept the volume forever), and restoring it after its expiry left the PVC with no owner at all."""
    body = pvc_sandbox("brief", {})
    body["spec"]["shutdownTime"] = format_time(datetime.now(UTC) + timedelta(seconds=25))
    body["spec"]["shutdownPolicy"] = "Delete"
    await kube.create(SANDBOX, body, namespace=namespace)
    await ready_ip(kube, namespace, "brief")
    await hibernate(kube, "brief", namespace)
    await archived(kube, namespace, "brief")
    assert await get_or_none(kube, PVC, "data-brief", namespace) is not None

    async def gone() -> bool:
        archive = await get_or_none(kube, lc.ARCHIVE, "brief", namespace)
        pvc = await get_or_none(kube, PVC, "data-brief", namespace)
        return archive is None and (pvc is None or bool(pvc["metadata"].get("deletionTimestamp")))

    await eventually(gone, "the expired archive deleted, and its PVC with it", within=90)
    assert await get_or_none(kube, SANDBOX, "brief", namespace) is None  # never restored
    with pytest.raises(NoSuchSandbox):
        await resume(kube, "brief", namespace)
