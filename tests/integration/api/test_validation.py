"""Invalid objects are rejected by the real API server with a message naming the field (api spec §2-§6).

Each row is applied with `kubectl apply --dry-run=server` (strict field validation, kubectl's
default), so nothing is stored; rows marked as updates first create a valid object for real.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

import pytest

from agent_sandbox.devcluster import DevCluster

if TYPE_CHECKING:
    from tests.integration.api.conftest import LiveWebhook

pytestmark = pytest.mark.integration

BETA = "agents.x-k8s.io/v1beta1"
ALPHA = "agents.x-k8s.io/v1alpha1"
EXT_BETA = "extensions.agents.x-k8s.io/v1beta1"
EXT_ALPHA = "extensions.agents.x-k8s.io/v1alpha1"
POD = {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}
VCT = [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                               "resources": {"requests": {"storage": "1Gi"}}}}]  # fmt: skip


def sandbox(api: str = BETA, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"podTemplate": copy.deepcopy(POD), **spec}
    return {"apiVersion": api, "kind": "Sandbox", "metadata": {"name": "bad"}, "spec": body}


def template(api: str = EXT_BETA, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"podTemplate": copy.deepcopy(POD), **spec}
    return {"apiVersion": api, "kind": "SandboxTemplate", "metadata": {"name": "bad"}, "spec": body}


def claim(api: str = EXT_BETA, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"warmPoolRef": {"name": "pool"}, **spec} if api == EXT_BETA else dict(spec)
    return {"apiVersion": api, "kind": "SandboxClaim", "metadata": {"name": "bad"}, "spec": body}


def pool(api: str = EXT_BETA, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"sandboxTemplateRef": {"name": "t"}, **spec}
    return {"apiVersion": api, "kind": "SandboxWarmPool", "metadata": {"name": "bad"}, "spec": body}


def without(obj: dict[str, Any], *path: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def with_pod(obj: dict[str, Any], **pod_spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["spec"]["podTemplate"]["spec"].update(pod_spec)
    return out


CASES: list[tuple[str, dict[str, Any], str]] = [
    # --- Sandbox v1beta1
    ("sandbox missing spec", without(sandbox(), "spec"), "spec: Required value"),
    ("missing podTemplate", without(sandbox(), "spec", "podTemplate"), "spec.podTemplate: Required value"),
    ("podTemplate missing spec", without(sandbox(), "spec", "podTemplate", "spec"),
     "spec.podTemplate.spec: Required value"),
    ("pod spec missing containers", with_pod(without(sandbox(), "spec", "podTemplate", "spec", "containers")),
     "spec.podTemplate.spec.containers: Required value"),
    ("container missing name", with_pod(sandbox(), containers=[{"image": "busybox"}]),
     "spec.podTemplate.spec.containers[0].name: Required value"),
    ("duplicate container names", with_pod(sandbox(), containers=[{"name": "c"}, {"name": "c"}]),
     "spec.podTemplate.spec.containers[1]: Duplicate value"),
    ("duplicate port after TCP default",
     with_pod(sandbox(), containers=[{"name": "c", "ports": [{"containerPort": 80}, {"containerPort": 80,
                                                                                    "protocol": "TCP"}]}]),
     "spec.podTemplate.spec.containers[0].ports[1]: Duplicate value"),
    ("bad operatingMode enum", sandbox(operatingMode="Paused"),
     'spec.operatingMode: Unsupported value: "Paused"'),
    ("bad shutdownPolicy enum", sandbox(shutdownPolicy="Archive"),
     'spec.shutdownPolicy: Unsupported value: "Archive"'),
    ("bad date-time", sandbox(shutdownTime="tomorrow"), "spec.shutdownTime"),
    ("service not a boolean", sandbox(service="yes"), "spec.service"),
    ("unknown spec field (strict)", sandbox(replicas=1), 'unknown field "spec.replicas"'),
    ("unknown pod metadata field", sandbox(podTemplate={"metadata": {"name": "x"}, "spec": POD["spec"]}),
     'unknown field "spec.podTemplate.metadata.name"'),
    ("unknown PodSpec field", with_pod(sandbox(), containerz=[]), 'unknown field "spec.podTemplate.spec.containerz"'),
    ("volumeClaimTemplate missing spec", sandbox(volumeClaimTemplates=[{"metadata": {"name": "d"}}]),
     "spec.volumeClaimTemplates[0].spec: Required value"),
    ("quantity not a quantity",
     with_pod(sandbox(), containers=[{"name": "c", "resources": {"limits": {"cpu": "lots"}}}]),
     "spec.podTemplate.spec.containers[0].resources.limits.cpu"),
    # --- Sandbox v1alpha1
    ("v1alpha1 replicas above 1", sandbox(ALPHA, replicas=2), "spec.replicas: Invalid value: 2"),
    ("v1alpha1 negative replicas", sandbox(ALPHA, replicas=-1), "spec.replicas: Invalid value: -1"),
    ("v1alpha1 has no operatingMode", sandbox(ALPHA, operatingMode="Running"),
     'unknown field "spec.operatingMode"'),
    # --- SandboxWarmPool
    ("pool negative replicas", pool(replicas=-3), "spec.replicas: Invalid value: -3"),
    ("pool missing template ref", without(pool(), "spec", "sandboxTemplateRef"),
     "spec.sandboxTemplateRef: Required value"),
    ("pool template ref missing name", pool(sandboxTemplateRef={}), "spec.sandboxTemplateRef.name: Required value"),
    ("pool bad update strategy", pool(updateStrategy={"type": "RollingUpdate"}),
     'spec.updateStrategy.type: Unsupported value: "RollingUpdate"'),
    ("v1alpha1 pool requires replicas", pool(EXT_ALPHA), "spec.replicas: Required value"),
    ("replicas not an integer", pool(replicas="two"), "spec.replicas"),
    # --- SandboxClaim
    ("claim missing warmPoolRef", without(claim(), "spec", "warmPoolRef"), "spec.warmPoolRef: Required value"),
    ("claim warmPoolRef missing name", claim(warmPoolRef={}), "spec.warmPoolRef.name: Required value"),
    ("claim bad shutdownPolicy", claim(lifecycle={"shutdownPolicy": "Later"}),
     'spec.lifecycle.shutdownPolicy: Unsupported value: "Later"'),
    ("claim negative ttl", claim(lifecycle={"ttlSecondsAfterFinished": -5}),
     "spec.lifecycle.ttlSecondsAfterFinished: Invalid value: -5"),
    ("claim bad shutdownTime", claim(lifecycle={"shutdownTime": "2026-13-45"}), "spec.lifecycle.shutdownTime"),
    ("claim env without value", claim(env=[{"name": "A"}]), "spec.env[0].value: Required value"),
    ("claim VCT missing spec", claim(volumeClaimTemplates=[{"metadata": {"name": "w"}}]),
     "spec.volumeClaimTemplates[0].spec: Required value"),
    ("v1alpha1 claim missing template ref", claim(EXT_ALPHA), "spec.sandboxTemplateRef: Required value"),
    ("v1alpha1 claim has no warmPoolRef", claim(EXT_ALPHA, sandboxTemplateRef={"name": "t"},
                                                warmPoolRef={"name": "p"}), 'unknown field "spec.warmPoolRef"'),
    # --- SandboxTemplate
    ("template bad networkPolicyManagement", template(networkPolicyManagement="Sometimes"),
     'spec.networkPolicyManagement: Unsupported value: "Sometimes"'),
    ("template bad envVarsInjectionPolicy", template(envVarsInjectionPolicy="Always"),
     'spec.envVarsInjectionPolicy: Unsupported value: "Always"'),
    ("template bad volumeClaimTemplatesPolicy", template(volumeClaimTemplatesPolicy="Maybe"),
     'spec.volumeClaimTemplatesPolicy: Unsupported value: "Maybe"'),
    ("template unknown networkPolicy field", template(networkPolicy={"podSelector": {}}),
     'unknown field "spec.networkPolicy.podSelector"'),
    ("template ingress port not int-or-string", template(networkPolicy={"ingress": [{"ports": [{"port": {"a": 1}}]}]}),
     "spec.networkPolicy.ingress[0].ports[0].port"),
    ("v1alpha1 template has no volumeClaimTemplatesPolicy", template(EXT_ALPHA, volumeClaimTemplatesPolicy="Allowed"),
     'unknown field "spec.volumeClaimTemplatesPolicy"'),
    ("template has no shutdownTime", template(shutdownTime="2030-01-01T00:00:00Z"),
     'unknown field "spec.shutdownTime"'),
]  # fmt: skip


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize(("obj", "message"), [(o, m) for _, o, m in CASES], ids=[n for n, _, _ in CASES])
def test_invalid_object_is_rejected(
    crds: DevCluster, namespace: str, obj: dict[str, Any], message: str
) -> None:
    out = crds.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(obj))
    assert out.returncode != 0, f"accepted: {out.stdout}"
    assert message in out.stderr, out.stderr
    assert "conversion webhook" not in out.stderr  # rejected by schema validation, not by a dead webhook


def test_valid_baselines_are_accepted(crds: DevCluster, namespace: str, webhook: LiveWebhook) -> None:
    """The fixtures the table mutates are valid: each failure above is caused by its mutation.

    v1alpha1 writes are converted to v1beta1 for storage, so they need the live webhook.
    """
    for obj in (sandbox(), sandbox(ALPHA, replicas=0), pool(), pool(EXT_ALPHA, replicas=0), claim(),
                claim(EXT_ALPHA, sandboxTemplateRef={"name": "t"}), template(), template(EXT_ALPHA)):  # fmt: skip
        out = crds.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(obj))
        assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"volumeClaimTemplates": VCT}, {"volumeClaimTemplates": [dict(VCT[0], metadata={"name": "other"})]}),
        ({"volumeClaimTemplates": VCT}, {"volumeClaimTemplates": None}),  # removing
        ({}, {"volumeClaimTemplates": VCT}),  # adding after creation
    ],
    ids=["change", "remove", "add"],
)
def test_volume_claim_templates_are_immutable(
    crds: DevCluster, namespace: str, before: dict[str, Any], after: dict[str, Any]
) -> None:
    crds.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(sandbox(**before)), check=True)
    patch = json.dumps({"spec": after})
    out = crds.kubectl("patch", "sandbox", "bad", "-n", namespace, "--type=merge", "-p", patch)
    assert out.returncode != 0, out.stdout
    assert "volumeClaimTemplates is immutable" in out.stderr
    assert "spec: Invalid value" in out.stderr
    # other spec fields stay mutable
    ok = crds.kubectl("patch", "sandbox", "bad", "-n", namespace, "--type=merge",
                      "-p", '{"spec":{"operatingMode":"Suspended"}}')  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_invalid_status_condition_is_rejected(crds: DevCluster, namespace: str) -> None:
    crds.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(sandbox()), check=True)
    cond = {"type": "Ready", "status": "Maybe", "reason": "", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    out = crds.kubectl("patch", "sandbox", "bad", "-n", namespace, "--subresource=status", "--type=merge",
                       "-p", json.dumps({"status": {"conditions": [cond]}}))  # fmt: skip
    assert out.returncode != 0
    assert 'status.conditions[0].status: Unsupported value: "Maybe"' in out.stderr
    assert "status.conditions[0].reason" in out.stderr
