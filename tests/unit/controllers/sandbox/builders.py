"""Raw-object builders for the Sandbox controller's unit tests (Sandbox, Pod, Service, PVC, Snapshot)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.api.constants import LABEL_SANDBOX_NAME_HASH
from agent_sandbox.api.meta import sandbox_pod_name
from agent_sandbox.api.naming import name_hash
from agent_sandbox.controllers.sandbox import Snapshot

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NS = "ns"
SB = "sb"
SB_UID = "uid-sb"
HASH = name_hash(SB)


def ref(
    kind: str = "Sandbox",
    name: str = SB,
    uid: str = SB_UID,
    *,
    api_version: str = "agents.x-k8s.io/v1beta1",
    controller: bool = True,
) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def sandbox(
    name: str = SB,
    *,
    uid: str = SB_UID,
    generation: int = 1,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    template_labels: Mapping[str, str] | None = None,
    template_annotations: Mapping[str, str] | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    init_containers: Sequence[Mapping[str, Any]] | None = None,
    volumes: Sequence[Mapping[str, Any]] | None = None,
    vcts: Sequence[Mapping[str, Any]] | None = None,
    service: bool | None = None,
    shutdown_time: datetime | None = None,
    shutdown_policy: str | None = None,
    mode: str | None = None,
    status: Mapping[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": uid,
        "generation": generation,
        "resourceVersion": "10",
    }
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [owner]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T11:00:00Z"
    pod_spec: dict[str, Any] = {"containers": list(containers or [{"name": "main", "image": "busybox"}])}
    if init_containers is not None:
        pod_spec["initContainers"] = list(init_containers)
    if volumes is not None:
        pod_spec["volumes"] = list(volumes)
    template: dict[str, Any] = {"spec": pod_spec}
    tmeta: dict[str, Any] = {}
    if template_labels is not None:
        tmeta["labels"] = dict(template_labels)
    if template_annotations is not None:
        tmeta["annotations"] = dict(template_annotations)
    if tmeta:
        template["metadata"] = tmeta
    spec: dict[str, Any] = {"podTemplate": template}
    if vcts is not None:
        spec["volumeClaimTemplates"] = list(vcts)
    if service is not None:
        spec["service"] = service
    if shutdown_time is not None:
        spec["shutdownTime"] = shutdown_time.strftime("%Y-%m-%dT%H:%M:%SZ")
    if shutdown_policy is not None:
        spec["shutdownPolicy"] = shutdown_policy
    if mode is not None:
        spec["operatingMode"] = mode
    obj: dict[str, Any] = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": meta,
        "spec": spec,
    }
    if status is not None:
        obj["status"] = dict(status)
    return obj


def vct(
    name: str = "data",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {
        "metadata": meta,
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def pod(
    name: str = SB,
    *,
    uid: str | None = None,
    owner: dict[str, Any] | None = None,
    owned: bool = True,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str | None = None,
    ready: bool = False,
    ips: Iterable[str] = (),
    node: str | None = None,
    scheduled: tuple[str, str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A (cache-transformed) Pod. `owned` adds a controller ref to the default Sandbox unless `owner` is given."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": uid or f"uid-pod-{name}",
        "resourceVersion": "5",
        "labels": dict(labels) if labels is not None else {LABEL_SANDBOX_NAME_HASH: HASH},
    }
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [owner]
    elif owned:
        meta["ownerReferences"] = [ref()]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T11:59:00Z"
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    conditions = []
    if scheduled is not None:
        conditions.append(
            {"type": "PodScheduled", "status": scheduled[0], "reason": scheduled[1], "message": scheduled[2]}
        )
    if ready:
        conditions.append({"type": "Ready", "status": "True"})
    if conditions:
        status["conditions"] = conditions
    if ips:
        status["podIPs"] = [{"ip": ip} for ip in ips]
        status["podIP"] = next(iter(status["podIPs"]))["ip"]
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
    }
    if status:
        obj["status"] = status
    return obj


def service(
    name: str = SB,
    *,
    owner: dict[str, Any] | None = None,
    owned: bool = True,
    labels: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    ports: Sequence[Mapping[str, Any]] | None = None,
    cluster_ip: str = "None",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-svc-{name}",
        "resourceVersion": "7",
        "labels": dict(labels) if labels is not None else {LABEL_SANDBOX_NAME_HASH: HASH},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    elif owned:
        meta["ownerReferences"] = [ref()]
    spec: dict[str, Any] = {
        "clusterIP": cluster_ip,
        "selector": dict(selector) if selector is not None else {LABEL_SANDBOX_NAME_HASH: HASH},
    }
    if ports is not None:
        spec["ports"] = [dict(p) for p in ports]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def pvc(
    name: str = f"data-{SB}",
    *,
    owner: dict[str, Any] | None = None,
    owned: bool = True,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-pvc-{name}",
        "resourceVersion": "3",
        "labels": dict(labels or {}),
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    elif owned:
        meta["ownerReferences"] = [ref()]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": {}}


def snap(
    sb: dict[str, Any],
    *,
    pods: Sequence[dict[str, Any]] = (),
    svc: dict[str, Any] | None = None,
    pvcs: Sequence[dict[str, Any]] = (),
    **kwargs: Any,
) -> Snapshot:
    """A Snapshot as `SandboxReconciler.observe` would take it from a cache holding these objects."""
    hash_ = name_hash(sb["metadata"]["name"])
    indexed = tuple(
        p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_SANDBOX_NAME_HASH) == hash_
    )
    tracked_name = sandbox_pod_name(sb)
    tracked = next((p for p in pods if p["metadata"]["name"] == tracked_name), None)
    return Snapshot(
        sandbox=sb,
        pods=indexed,
        tracked_pod=tracked,
        service=svc,
        pvcs={p["metadata"]["name"]: p for p in pvcs},
        **kwargs,
    )
