"""Sandbox controller on a real control plane (controllers spec §1), reconciler running in-process.

Each test gets a fresh namespace and its own manager whose cache is scoped to that namespace, so the
controller under test only ever sees the test's objects. kwok plays the kubelet (Pods become Running and
Ready with IPs), kube-controller-manager garbage-collects owned children, the dev cluster's provisioner
binds PVCs. No mocks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api.constants import (
    ANNOTATION_POD_NAME,
    ANNOTATION_PROPAGATED_LABELS,
    LABEL_ADOPTABLE,
    LABEL_SANDBOX_NAME_HASH,
)
from agent_sandbox.api.naming import name_hash
from agent_sandbox.controllers.context import ControllerContext
from agent_sandbox.controllers.options import Options
from agent_sandbox.controllers.sandbox import setup as setup_sandbox_controller
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.devcluster.identity import controller_kubeconfig
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SERVICE,
    ApiClient,
    CacheOptions,
    Manager,
    ManagerOptions,
    NotFound,
    Object,
    PatchType,
)
from tests import helpers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def crds(cluster: DevCluster) -> None:
    install_crds(cluster)


@pytest.fixture
async def manager(cluster: DevCluster, namespace: str, crds: None) -> AsyncIterator[Manager]:
    """The Sandbox controller in this process, caching only `namespace` (as the controller's identity)."""
    api = await ApiClient.from_kubeconfig(str(controller_kubeconfig(cluster)))
    options = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        cache=CacheOptions(namespace=namespace),
        registry=CollectorRegistry(),
    )
    mgr = Manager(api, options)
    setup_sandbox_controller(
        mgr, ControllerContext(Options(sandbox_concurrent_workers=4, cluster_domain="test.local"))
    )
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    try:
        await asyncio.wait_for(mgr.elected.wait(), 60)
        yield mgr
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await api.close()


eventually = functools.partial(helpers.eventually, within=30.0)


def sandbox_manifest(name: str, **spec: Any) -> Object:
    template = spec.pop(
        "podTemplate",
        {"spec": {"containers": [{"name": "main", "image": "busybox", "ports": [{"containerPort": 8080}]}]}},
    )
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": template, **spec},
    }


VCT = [
    {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
]


async def maybe(kube: ApiClient, kind: Any, name: str, ns: str) -> Object | None:
    try:
        return await kube.get(kind, name, namespace=ns)
    except NotFound:
        return None


def condition(sb: Object, type_: str) -> tuple[str, str, str] | None:
    for c in (sb.get("status") or {}).get("conditions") or ():
        if c["type"] == type_:
            return (c["status"], c["reason"], c.get("message", ""))
    return None


async def ready_sandbox(kube: ApiClient, name: str, ns: str, within: float = 30.0) -> Object:
    async def probe() -> Object | None:
        sb = await kube.get(SANDBOX, name, namespace=ns)
        ready = condition(sb, "Ready")
        return sb if ready is not None and ready[0] == "True" else None

    return await eventually(probe, f"Sandbox {name} Ready", within=within)


async def gone(kube: ApiClient, kind: Any, name: str, ns: str, within: float = 30.0) -> None:
    async def probe() -> bool:
        return await maybe(kube, kind, name, ns) is None

    await eventually(probe, f"{kind.kind} {name} deleted", within=within)


async def test_create_becomes_ready_with_pod_ips(manager: Manager, kube: ApiClient, namespace: str) -> None:
    template = {
        "metadata": {
            "labels": {"app": "demo", LABEL_SANDBOX_NAME_HASH: "hijack", "agents.x-k8s.io/claim-uid": "x"},
            "annotations": {"note": "n", "opentelemetry.io/trace-context": "{}"},
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    await kube.create(SANDBOX, sandbox_manifest("sb1", podTemplate=template), namespace=namespace)
    sb = await ready_sandbox(kube, "sb1", namespace)
    pod = await kube.get(POD, "sb1", namespace=namespace)
    assert sb["status"]["podIPs"] == [ip["ip"] for ip in pod["status"]["podIPs"]]
    assert sb["status"]["podIPs"]
    assert sb["status"]["nodeName"] == pod["spec"]["nodeName"]
    assert sb["status"]["selector"] == f"{LABEL_SANDBOX_NAME_HASH}={name_hash('sb1')}"
    assert condition(sb, "Ready") == ("True", "DependenciesReady", "Pod is Ready")
    assert condition(sb, "PodScheduled") == ("True", "PodScheduled", "")
    assert sb["metadata"]["annotations"][ANNOTATION_POD_NAME] == "sb1"
    # Nobody server-side applied it: the pod-name patch dropped its managedFields, and with none
    # kube-apiserver recorded none for the status writes after it (docs/design/managed-fields.md).
    assert "managedFields" not in sb["metadata"]
    # Reserved keys of the template are not copied; the tracking label cannot be hijacked.
    assert pod["metadata"]["labels"] == {"app": "demo", LABEL_SANDBOX_NAME_HASH: name_hash("sb1")}
    assert pod["metadata"]["annotations"]["note"] == "n"
    assert "opentelemetry.io/trace-context" not in pod["metadata"]["annotations"]
    assert pod["metadata"]["annotations"][ANNOTATION_PROPAGATED_LABELS] == "app"
    (owner,) = pod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"], owner["blockOwnerDeletion"]) == (
        "Sandbox",
        sb["metadata"]["uid"],
        True,
        True,
    )
    assert await maybe(kube, SERVICE, "sb1", namespace) is None  # spec.service unset: no Service


async def test_an_applied_sandbox_keeps_its_managed_fields(
    manager: Manager, kube: ApiClient, namespace: str
) -> None:
    """docs/design/managed-fields.md: a Sandbox someone server-side applied keeps its entries (apply's
    conflict detection reads them); applying one whose entries were dropped works and is tracked again."""
    applied = sandbox_manifest("applied")
    await kube.patch(
        SANDBOX, "applied", applied, namespace=namespace, patch_type=PatchType.APPLY, field_manager="gitops"
    )
    await kube.create(SANDBOX, sandbox_manifest("posted"), namespace=namespace)
    kept = await ready_sandbox(kube, "applied", namespace)
    posted = await ready_sandbox(kube, "posted", namespace)
    assert kept["metadata"]["annotations"][ANNOTATION_POD_NAME] == "applied"  # the pod-name patch ran
    assert ("gitops", "Apply") in {(e["manager"], e["operation"]) for e in kept["metadata"]["managedFields"]}
    assert "managedFields" not in posted["metadata"]
    await helpers.apply_labelled(kube, SANDBOX, sandbox_manifest("posted"), {"team": "blue"}, namespace)
    # Applying again without the label removes it: apply owns what it set, without a conflict.
    again = await helpers.apply_labelled(kube, SANDBOX, sandbox_manifest("posted"), {}, namespace)
    assert "team" not in (again["metadata"].get("labels") or {})


async def test_suspend_keeps_pvc_and_service_then_resume_reattaches(
    manager: Manager, kube: ApiClient, namespace: str
) -> None:
    await kube.create(
        SANDBOX, sandbox_manifest("sb", service=True, volumeClaimTemplates=VCT), namespace=namespace
    )
    await ready_sandbox(kube, "sb", namespace)
    claim = await kube.get(PVC, "data-sb", namespace=namespace)
    svc = await kube.get(SERVICE, "sb", namespace=namespace)

    async def bound() -> bool:
        return (await kube.get(PVC, "data-sb", namespace=namespace)).get("status", {}).get("phase") == "Bound"

    await eventually(bound, "PVC data-sb Bound")
    await kube.patch(SANDBOX, "sb", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)

    async def suspended() -> Object | None:
        sb = await kube.get(SANDBOX, "sb", namespace=namespace)
        return (
            sb
            if condition(sb, "Suspended")
            == ("True", "PodTerminated", "Pod has been terminated. Sandbox is suspended")
            else None
        )

    sb = await eventually(suspended, "Suspended=True")
    assert await maybe(kube, POD, "sb", namespace) is None
    assert condition(sb, "Ready") == ("False", "SandboxSuspended", "Sandbox is suspended")
    assert ANNOTATION_POD_NAME not in (sb["metadata"].get("annotations") or {})
    assert "podIPs" not in sb["status"]
    assert (await kube.get(PVC, "data-sb", namespace=namespace))["metadata"]["uid"] == claim["metadata"][
        "uid"
    ]
    assert (await kube.get(SERVICE, "sb", namespace=namespace))["metadata"]["uid"] == svc["metadata"]["uid"]

    await kube.patch(SANDBOX, "sb", {"spec": {"operatingMode": "Running"}}, namespace=namespace)
    sb = await ready_sandbox(kube, "sb", namespace)
    assert condition(sb, "Suspended") == ("False", "NotSuspended", "Sandbox is not suspended")
    assert sb["status"]["serviceFQDN"] == f"sb.{namespace}.svc.test.local"
    pod = await kube.get(POD, "sb", namespace=namespace)
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "data-sb"}} in pod["spec"]["volumes"]
    assert (await kube.get(PVC, "data-sb", namespace=namespace))["metadata"]["uid"] == claim["metadata"][
        "uid"
    ]
    assert [p["metadata"]["name"] for p in await kube.list(PVC, namespace=namespace)] == ["data-sb"]


def _soon(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_shutdown_time_retain_tears_down_children_and_keeps_the_sandbox(
    manager: Manager, kube: ApiClient, namespace: str
) -> None:
    manifest = sandbox_manifest(
        "sb", service=True, volumeClaimTemplates=VCT, shutdownTime=_soon(4), shutdownPolicy="Retain"
    )
    await kube.create(SANDBOX, manifest, namespace=namespace)
    await ready_sandbox(kube, "sb", namespace)

    async def expired() -> Object | None:
        sb = await kube.get(SANDBOX, "sb", namespace=namespace)
        return (
            sb
            if condition(sb, "Ready") == ("False", "SandboxExpired", "Sandbox has expired")
            and set(sb["status"]) == {"conditions"}
            else None
        )

    sb = await eventually(expired, "Ready=SandboxExpired with only conditions in status")
    assert condition(sb, "PodScheduled") is None
    await gone(kube, POD, "sb", namespace)
    await gone(kube, SERVICE, "sb", namespace)
    assert await maybe(kube, PVC, "data-sb", namespace) is not None  # PVCs survive expiry
    assert await maybe(kube, SANDBOX, "sb", namespace) is not None


async def test_shutdown_time_delete_removes_the_sandbox_and_gc_its_children(
    manager: Manager, kube: ApiClient, namespace: str
) -> None:
    manifest = sandbox_manifest(
        "sb", service=True, volumeClaimTemplates=VCT, shutdownTime=_soon(4), shutdownPolicy="Delete"
    )
    await kube.create(SANDBOX, manifest, namespace=namespace)
    await ready_sandbox(kube, "sb", namespace)
    await gone(kube, SANDBOX, "sb", namespace)
    await gone(kube, POD, "sb", namespace)
    await gone(kube, SERVICE, "sb", namespace)
    await gone(kube, PVC, "data-sb", namespace)


async def test_service_true_false_unset(manager: Manager, kube: ApiClient, namespace: str) -> None:
    await kube.create(SANDBOX, sandbox_manifest("sb", service=True), namespace=namespace)
    sb = await ready_sandbox(kube, "sb", namespace)
    assert condition(sb, "Ready") == ("True", "DependenciesReady", "Pod is Ready; Service Exists")
    svc = await kube.get(SERVICE, "sb", namespace=namespace)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {LABEL_SANDBOX_NAME_HASH: name_hash("sb")}
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("p-8080-tcp", 8080, 8080)
    ]

    # Unset: an owned Service is kept (and still required for Ready), never deleted.
    await kube.patch(SANDBOX, "sb", {"spec": {"service": None}}, namespace=namespace)
    await asyncio.sleep(1.0)
    assert (await kube.get(SERVICE, "sb", namespace=namespace))["metadata"]["uid"] == svc["metadata"]["uid"]
    assert condition(await kube.get(SANDBOX, "sb", namespace=namespace), "Ready") == (
        "True",
        "DependenciesReady",
        "Pod is Ready; Service Exists",
    )

    # False: the owned Service is deleted and the status fields cleared.
    await kube.patch(SANDBOX, "sb", {"spec": {"service": False}}, namespace=namespace)
    await gone(kube, SERVICE, "sb", namespace)

    async def cleared() -> Object | None:
        sb = await kube.get(SANDBOX, "sb", namespace=namespace)
        return (
            sb
            if "service" not in sb["status"]
            and condition(sb, "Ready") == ("True", "DependenciesReady", "Pod is Ready")
            else None
        )

    sb = await eventually(cleared, "service status cleared")
    assert "serviceFQDN" not in sb["status"]

    # Unset again with no Service: nothing is created.
    await kube.patch(SANDBOX, "sb", {"spec": {"service": None}}, namespace=namespace)
    await asyncio.sleep(1.0)
    assert await maybe(kube, SERVICE, "sb", namespace) is None


async def test_adopts_a_pre_created_pod(manager: Manager, kube: ApiClient, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "warm", "labels": {LABEL_ADOPTABLE: "true"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    created = await kube.create(POD, pod, namespace=namespace)

    async def running() -> bool:
        p = await kube.get(POD, "warm", namespace=namespace)
        return bool(p.get("status", {}).get("podIPs"))

    await eventually(running, "pre-created Pod running")
    manifest = sandbox_manifest("sb")
    manifest["metadata"]["annotations"] = {ANNOTATION_POD_NAME: "warm"}
    await kube.create(SANDBOX, manifest, namespace=namespace)
    sb = await ready_sandbox(kube, "sb", namespace)
    adopted = await kube.get(POD, "warm", namespace=namespace)
    assert adopted["metadata"]["uid"] == created["metadata"]["uid"]
    assert adopted["metadata"]["ownerReferences"][0]["uid"] == sb["metadata"]["uid"]
    assert adopted["metadata"]["labels"][LABEL_SANDBOX_NAME_HASH] == name_hash("sb")
    assert sb["status"]["podIPs"] == [ip["ip"] for ip in adopted["status"]["podIPs"]]
    assert await maybe(kube, POD, "sb", namespace) is None  # no second Pod


async def test_unauthorised_pod_is_refused(manager: Manager, kube: ApiClient, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sb"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    await kube.create(POD, pod, namespace=namespace)
    await kube.create(SANDBOX, sandbox_manifest("sb"), namespace=namespace)

    async def refused() -> Object | None:
        sb = await kube.get(SANDBOX, "sb", namespace=namespace)
        ready = condition(sb, "Ready")
        return sb if ready is not None and ready[1] == "ReconcilerError" else None

    sb = await eventually(refused, "Ready=ReconcilerError")
    assert 'cannot adopt unowned pod "sb"' in condition(sb, "Ready")[2]  # type: ignore[index]
    assert "ownerReferences" not in (await kube.get(POD, "sb", namespace=namespace))["metadata"]


async def test_deleting_the_sandbox_garbage_collects_children(
    manager: Manager, kube: ApiClient, namespace: str
) -> None:
    await kube.create(
        SANDBOX, sandbox_manifest("sb", service=True, volumeClaimTemplates=VCT), namespace=namespace
    )
    await ready_sandbox(kube, "sb", namespace)
    await kube.delete(SANDBOX, "sb", namespace=namespace)
    await gone(kube, SANDBOX, "sb", namespace)
    await gone(kube, POD, "sb", namespace)
    await gone(kube, SERVICE, "sb", namespace)
    await gone(kube, PVC, "data-sb", namespace)


async def test_many_sandboxes_each_get_exactly_one_pod(
    manager: Manager, kube: ApiClient, namespace: str
) -> None:
    names = [f"sb-{uuid.uuid4().hex[:6]}" for _ in range(20)]
    await asyncio.gather(*(kube.create(SANDBOX, sandbox_manifest(n), namespace=namespace) for n in names))
    for n in names:
        await ready_sandbox(kube, n, namespace)
    pods = await kube.list(POD, namespace=namespace)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(names)


async def test_a_reused_name_waits_for_the_predecessors_pod_without_error_logs(
    manager: Manager, kube: ApiClient, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A warm pool's generated names are reused over time; the new member can meet its deleted namesake's
    # Pod still terminating (held here by a finalizer). Expected: the §1.6 refusal on the condition, a
    # wait logged at info (not an error), and our own Pod once the old one is gone.
    caplog.set_level(logging.INFO, logger="agent_sandbox.kube.controller")
    await kube.create(SANDBOX, sandbox_manifest("sb"), namespace=namespace)
    old_uid = (await ready_sandbox(kube, "sb", namespace))["metadata"]["uid"]
    hold = {"metadata": {"finalizers": ["example.com/hold"]}}
    await kube.patch(POD, "sb", hold, namespace=namespace)
    # The Pod's delete is issued here rather than left to the garbage collector, whose REST mapping of a
    # freshly installed CRD can lag by tens of seconds; the state is the same: terminating, old owner.
    await kube.delete(POD, "sb", namespace=namespace)
    await kube.delete(SANDBOX, "sb", namespace=namespace)
    await gone(kube, SANDBOX, "sb", namespace)
    assert (await kube.get(POD, "sb", namespace=namespace))["metadata"].get("deletionTimestamp")
    new_uid = (await kube.create(SANDBOX, sandbox_manifest("sb"), namespace=namespace))["metadata"]["uid"]

    async def refused() -> tuple[str, str, str] | None:
        ready = condition(await kube.get(SANDBOX, "sb", namespace=namespace), "Ready")
        return ready if ready is not None and ready[1] == "ReconcilerError" else None

    ready = await eventually(refused, "Ready=ReconcilerError naming the old owner")
    assert f'pod "sb" is owned by Sandbox/sb (UID: {old_uid})' in ready[2]
    await kube.patch(POD, "sb", {"metadata": {"finalizers": None}}, namespace=namespace)
    await ready_sandbox(kube, "sb", namespace)
    assert (await kube.get(POD, "sb", namespace=namespace))["metadata"]["ownerReferences"][0][
        "uid"
    ] == new_uid
    about = [r for r in caplog.records if f"Sandbox/sb (UID: {old_uid})" in r.getMessage()]
    assert about, "the wait was never logged"
    assert {r.levelname for r in about} == {"INFO"}
