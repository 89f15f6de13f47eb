"""Scale subresource on the warm pool (HPA / kubectl scale) and printer columns (api spec §1.2)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.devcluster import DevCluster

if TYPE_CHECKING:
    from tests.integration.api.conftest import LiveWebhook

pytestmark = pytest.mark.integration

POD = {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def create(cluster: DevCluster, ns: str, obj: dict[str, Any]) -> None:
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj), check=True)


def raw(cluster: DevCluster, path: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cluster.kubectl("get", "--raw", path, check=True).stdout)
    return out


def test_warm_pool_scale_subresource(crds: DevCluster, namespace: str) -> None:
    create(crds, namespace, {"apiVersion": c.EXTENSIONS_API_VERSION, "kind": "SandboxWarmPool",
                             "metadata": {"name": "pool"}, "spec": {"sandboxTemplateRef": {"name": "t"}}})  # fmt: skip
    crds.kubectl("scale", "swp/pool", "-n", namespace, "--replicas=4", check=True)
    pool = json.loads(crds.kubectl("get", "swp", "pool", "-n", namespace, "-o", "json", check=True).stdout)
    assert pool["spec"]["replicas"] == 4

    selector = naming.warm_pool_selector("pool")
    status = {"status": {"replicas": 3, "readyReplicas": 2, "selector": selector, "observedGeneration": 2}}
    crds.kubectl("patch", "swp", "pool", "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps(status), check=True)  # fmt: skip
    path = f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxwarmpools/pool/scale"
    scale = raw(crds, path)
    assert scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 4}
    assert scale["status"] == {"replicas": 3, "selector": selector}

    # An HPA-style write through /scale.
    update = dict(scale, spec={"replicas": 0})
    crds.kubectl("replace", "--raw", path, "-f", "-", input=json.dumps(update), check=True)
    assert raw(crds, path)["spec"].get("replicas", 0) == 0
    fresh = raw(crds, path)
    negative = dict(fresh, spec={"replicas": -1})
    out = crds.kubectl("replace", "--raw", path, "-f", "-", input=json.dumps(negative))
    assert out.returncode != 0
    assert "spec.replicas" in out.stderr

    table = crds.kubectl("get", "swp", "pool", "-n", namespace, check=True).stdout.split("\n")
    assert table[0].split() == ["NAME", "READY", "DESIRED", "AGE"]
    assert table[1].split()[:3] == ["pool", "2", "0"]


def test_v1alpha1_scale_paths(crds: DevCluster, namespace: str, webhook: LiveWebhook) -> None:
    create(crds, namespace, {"apiVersion": c.EXTENSIONS_API_VERSION, "kind": "SandboxWarmPool",
                             "metadata": {"name": "legacy"}, "spec": {"sandboxTemplateRef": {"name": "t"}}})  # fmt: skip
    crds.kubectl("scale", "sandboxwarmpools.v1alpha1.extensions.agents.x-k8s.io/legacy", "-n", namespace,
                 "--replicas=7", check=True)  # fmt: skip
    pool = json.loads(crds.kubectl("get", "swp", "legacy", "-n", namespace, "-o", "json", check=True).stdout)
    assert pool["spec"]["replicas"] == 7

    create(crds, namespace, {"apiVersion": c.SANDBOX_API_VERSION, "kind": "Sandbox", "metadata": {"name": "sb"},
                             "spec": {"podTemplate": POD}})  # fmt: skip
    out = crds.kubectl("scale", "sandboxes.v1alpha1.agents.x-k8s.io/sb", "-n", namespace, "--replicas=2")
    assert out.returncode != 0  # v1alpha1 Sandbox replicas is 0..1
    assert "spec.replicas" in out.stderr


def test_sandbox_and_claim_printer_columns(crds: DevCluster, namespace: str) -> None:
    create(crds, namespace, {"apiVersion": c.SANDBOX_API_VERSION, "kind": "Sandbox", "metadata": {"name": "sb"},
                             "spec": {"podTemplate": POD}})  # fmt: skip
    ready = {"type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}  # fmt: skip
    crds.kubectl("patch", "sandbox", "sb", "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": [ready]}}), check=True)  # fmt: skip
    lines = crds.kubectl("get", "sandbox", "sb", "-n", namespace, check=True).stdout.split("\n")
    assert lines[0].split() == ["NAME", "READY", "REASON", "AGE"]
    assert lines[1].split()[:3] == ["sb", "True", "DependenciesReady"]

    create(crds, namespace, {"apiVersion": c.EXTENSIONS_API_VERSION, "kind": "SandboxClaim",
                             "metadata": {"name": "cl"}, "spec": {"warmPoolRef": {"name": "p"}}})  # fmt: skip
    status = {"status": {"sandbox": {"name": "p-abcde", "podIPs": ["10.0.0.3"]},
                         "conditions": [dict(ready, reason="DependenciesReady")]}}  # fmt: skip
    crds.kubectl("patch", "sandboxclaim", "cl", "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps(status), check=True)  # fmt: skip
    lines = crds.kubectl("get", "sandboxclaim", "cl", "-n", namespace, check=True).stdout.split("\n")
    assert lines[0].split() == ["NAME", "READY", "SANDBOX", "REASON", "AGE"]
    assert lines[1].split()[:4] == ["cl", "True", "p-abcde", "DependenciesReady"]


def test_short_names(crds: DevCluster, namespace: str) -> None:
    for short in ("sandbox", "sandboxtemplate", "sandboxclaim", "swp"):
        out = crds.kubectl("get", short, "-n", namespace)
        assert out.returncode == 0, out.stderr
    out = crds.kubectl("get", "all", "-n", namespace)  # no categories: our kinds are not in "all"
    assert "sandbox" not in out.stdout.lower()
