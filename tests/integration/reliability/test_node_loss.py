"""A kwok node goes NotReady with sandboxes on it: the controller does what docs/reliability.md says.

Documented behaviour (the same as upstream's: nothing in controllers spec §1-§4 reacts to Node state; the
Sandbox mirrors its Pod, and Kubernetes moves the Pod):

1. The node reports NotReady; kube-controller-manager marks its pods not Ready and taints the node
   (`node.kubernetes.io/not-ready`, NoSchedule and NoExecute).
2. Each Sandbox on it turns Ready=False, reason `DependenciesNotReady`, "Pod is Running but not Ready";
   a claim bound to one turns not Ready too. Nothing is deleted, nothing is created.
3. After the pods' NoExecute toleration (300 s unless the pod template says otherwise; here 2 s) the
   taint manager evicts them; the Sandbox controller creates the replacement Pod (same name) and the
   scheduler puts it on a Ready node. The Sandboxes (same UIDs), the claim's binding and the pool's
   membership stay; no Sandbox is created or deleted by anyone; the pool does not replace its members.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from benchmarks.reliability import controllers
from benchmarks.reliability.burst import claim_body, create_template_and_pool, is_ready, retrying

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.audit import AuditLog, sandbox_creates, writes
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import POD, SANDBOX, SANDBOX_CLAIM, ApiClient, Object
from tests.helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

TOLERATE_2S = [
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]
POD_SPEC = {"containers": [{"name": "main", "image": "busybox"}], "tolerations": TOLERATE_2S}


@pytest.fixture(scope="module")
def controller(fault_cluster: DevCluster) -> Iterator[Started]:
    with controllers.as_serviceaccount():
        started = controllers.start(fault_cluster)
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture
def lost_node(fault_cluster: DevCluster) -> Iterator[str]:
    """An extra node that every new pod lands on (the others cordoned while the test sets up)."""
    name = f"lost-{uuid.uuid4().hex[:6]}"
    fault_cluster.add_node(name)
    try:
        yield name
    finally:
        for node in fault_cluster.state.nodes:
            fault_cluster.cordon_node(node, cordoned=False)
        fault_cluster.delete_node(name)


def ready_reason(obj: Object) -> tuple[str, str, str]:
    cond = next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), {})
    return cond.get("status", ""), cond.get("reason", ""), cond.get("message", "")


async def test_node_not_ready_with_sandboxes_on_it(
    fault_cluster: DevCluster,
    fault_kube: ApiClient,
    fault_namespace: str,
    controller: Started,
    lost_node: str,
) -> None:
    cluster, api, ns = fault_cluster, fault_kube, fault_namespace
    for node in cluster.state.nodes:
        cluster.cordon_node(node)
    solo: Object = {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {"name": "solo"},
        "spec": {"podTemplate": {"spec": POD_SPEC}},
    }
    await api.create(SANDBOX, solo, namespace=ns)
    await create_template_and_pool(api, ns, 2, pod_spec=POD_SPEC)

    async def pool_ready() -> list[Object] | None:
        sandboxes = await api.list(SANDBOX, namespace=ns)
        return sandboxes if len(sandboxes) == 3 and all(is_ready(s) for s in sandboxes) else None

    await eventually(pool_ready, "solo and two pool members Ready")
    await api.create(SANDBOX_CLAIM, claim_body("claim"), namespace=ns)

    async def everything_ready() -> list[Object] | None:
        claim = await api.get(SANDBOX_CLAIM, "claim", namespace=ns)
        sandboxes = await api.list(SANDBOX, namespace=ns)
        ok = is_ready(claim) and len(sandboxes) == 4 and all(is_ready(s) for s in sandboxes)
        return sandboxes if ok else None

    before = await eventually(everything_ready, "the claim bound and the pool refilled")
    assert {s["status"].get("nodeName") for s in before} == {lost_node}
    uids = {s["metadata"]["name"]: s["metadata"]["uid"] for s in before}
    bound = (await api.get(SANDBOX_CLAIM, "claim", namespace=ns))["status"]["sandbox"]["name"]
    for node in cluster.state.nodes:
        cluster.cordon_node(node, cordoned=False)

    audit = AuditLog(cluster.audit_log)
    mark = audit.mark()
    t0 = time.monotonic()
    cluster.set_node_ready(lost_node, False)

    async def all_not_ready() -> list[Any] | None:
        sandboxes = await api.list(SANDBOX, namespace=ns)
        claim = await api.get(SANDBOX_CLAIM, "claim", namespace=ns)
        states = [ready_reason(s) for s in sandboxes]
        return states if not is_ready(claim) and all(s[0] == "False" for s in states) else None

    states = await eventually(all_not_ready, "every Sandbox and the claim not Ready", within=60)
    not_ready_s = time.monotonic() - t0
    assert ("False", "DependenciesNotReady", "Pod is Running but not Ready") in states
    assert {s[1] for s in states} <= {"DependenciesNotReady"}

    async def recovered() -> list[Object] | None:
        sandboxes = await retrying(lambda: api.list(SANDBOX, namespace=ns))
        claim = await api.get(SANDBOX_CLAIM, "claim", namespace=ns)
        moved = all(
            is_ready(s) and s["status"].get("nodeName") not in ("", None, lost_node) for s in sandboxes
        )
        return sandboxes if moved and is_ready(claim) and len(sandboxes) == 4 else None

    after = await eventually(recovered, "every Sandbox Ready again on a Ready node", within=120)
    recovered_s = time.monotonic() - t0
    print(f"not Ready after {not_ready_s:.1f}s, Ready again on another node after {recovered_s:.1f}s")
    assert {s["metadata"]["name"]: s["metadata"]["uid"] for s in after} == uids  # the same Sandboxes
    claim = await api.get(SANDBOX_CLAIM, "claim", namespace=ns)
    assert claim["status"]["sandbox"]["name"] == bound  # the same binding
    pods = await api.list(POD, namespace=ns)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(uids)  # one Pod each, named as before
    assert {p["spec"]["nodeName"] for p in pods}.isdisjoint({lost_node})

    events = audit.since(mark)
    assert sandbox_creates(events, ns) == []  # the pool replaced nobody
    sandbox_deletes = [e for e in writes(events, namespace=ns, resource="sandboxes") if e.verb == "delete"]
    assert sandbox_deletes == []
    pod_writes = [
        e for e in writes(events, namespace=ns, resource="pods") if not e.subresource and e.succeeded
    ]
    pod_creates = [e for e in pod_writes if e.verb == "create"]
    assert sorted(e.name for e in pod_creates) == sorted(uids)  # one replacement Pod per Sandbox
    assert {e.user_agent.split("/")[0] for e in pod_creates} == {"agent-sandbox-controller"}
    evictions = [e for e in pod_writes if e.verb == "delete"]
    assert sorted(e.name for e in evictions) == sorted(uids)  # each old Pod evicted once...
    assert {e.user for e in evictions} == {
        "system:serviceaccount:kube-system:node-controller"
    }  # ...by Kubernetes
