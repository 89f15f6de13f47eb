"""Builders shared by the warm pool unit tests (raw wire dicts, as the cache hands them out)."""

from __future__ import annotations

import copy
import time
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.blueprint import blueprint_hash, pod_template_hash
from agent_sandbox.controllers.indexes import INDEX_SANDBOX_WARM_POOL, sandbox_warm_pool_index
from agent_sandbox.controllers.warmpool.members import build_member
from agent_sandbox.kube import SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL
from agent_sandbox.kube.testing import FakeClient

NS = "ns"
POOL_UID = "pool-uid"
NOW = float(int(time.time()))  # wall clock of the tests; close to the FakeClient's creationTimestamps


def ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def template(name: str = "tmpl", image: str = "img:1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": name, "namespace": NS, "uid": f"{name}-uid"},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
                "spec": {"containers": [{"name": "main", "image": image}]},
            },
            **spec,
        },
    }


def pool(
    replicas: int | None = 3,
    *,
    name: str = "pool",
    template_name: str = "tmpl",
    strategy: str | None = None,
    generation: int = 1,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"sandboxTemplateRef": {"name": template_name}}
    if replicas is not None:
        spec["replicas"] = replicas
    if strategy is not None:
        spec["updateStrategy"] = {"type": strategy}
    obj: dict[str, Any] = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name, "namespace": NS, "uid": POOL_UID, "generation": generation},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def member(
    name: str,
    *,
    tmpl: dict[str, Any] | None = None,
    pool_obj: dict[str, Any] | None = None,
    ready: bool = True,
    age: float = 3600.0,
    owner_uid: str | None = POOL_UID,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """A pool member as the pool controller would have created it, `age` seconds before NOW."""
    tmpl = tmpl or template()
    p = pool_obj or pool()
    body = build_member(
        p,
        tmpl,
        pod_template_hash=pod_template_hash(tmpl["spec"]),
        blueprint_hash=blueprint_hash(tmpl["spec"]),
        enable_eviction=True,
    )
    meta = body["metadata"]
    del meta["generateName"]
    meta.update(name=name, uid=uid or f"{name}-uid", resourceVersion="1", creationTimestamp=ts(NOW - age))
    if owner_uid is None:
        del meta["ownerReferences"]
    else:
        meta["ownerReferences"][0]["uid"] = owner_uid
        if owner_uid != POOL_UID:
            meta["ownerReferences"][0].update(kind="SandboxClaim", name="claim")
    if deleting:
        meta["deletionTimestamp"] = ts(NOW)
        meta["finalizers"] = ["test/hold"]
    if labels is not None:
        meta["labels"].update(labels)
    body["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "DependenciesReady" if ready else "DependenciesNotReady",
                "message": "",
                "lastTransitionTime": ts(NOW),
            }
        ]
    }
    return body


def unschedulable_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def fake_cluster(*objects: tuple[Any, dict[str, Any]]) -> FakeClient:
    fake = FakeClient(*objects)
    fake.add_index(SANDBOX, INDEX_SANDBOX_WARM_POOL, sandbox_warm_pool_index)
    return fake


def standard(replicas: int | None = 3, **pool_kw: Any) -> FakeClient:
    return fake_cluster((SANDBOX_TEMPLATE, template()), (SANDBOX_WARM_POOL, pool(replicas, **pool_kw)))


def copy_of(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)


__all__ = ["NOW", "NS", "POOL_UID", "c"]
