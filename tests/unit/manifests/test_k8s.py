"""The checked-in install manifests (k8s/) keep upstream's names, labels, ports and RBAC (operations §2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.api import constants as c
from agent_sandbox.manifests import (
    LEADER_ELECTION_NAME,
    LEADER_ELECTION_ROLE,
    REPO_ROOT,
    WEBHOOK_CERT_ROLE,
    check,
    role,
    role_binding,
)

pytestmark = pytest.mark.unit

K8S = REPO_ROOT / "k8s"
NS = "agent-sandbox-system"
NAME = "agent-sandbox-controller"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_generated_files_are_current() -> None:
    """`agent-sandbox generate --check` in-process: CRDs, RBAC and their Helm copies match the sources."""
    assert check() == []


def test_controller_yaml_objects_and_identities() -> None:
    docs = _docs(K8S / "controller.yaml")
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Namespace", NS),
        ("ServiceAccount", NAME),
        ("ClusterRoleBinding", NAME),
        ("Role", NAME),
        ("RoleBinding", NAME),
        ("Role", LEADER_ELECTION_NAME),  # not upstream's: the Lease grants, namespaced
        ("RoleBinding", LEADER_ELECTION_NAME),
        ("Service", NAME),
        ("Deployment", NAME),
        ("Service", c.WEBHOOK_SERVICE_NAME),
    ]
    for doc in docs[1:]:
        if doc["kind"] != "ClusterRoleBinding":
            assert doc["metadata"]["namespace"] == NS, doc["kind"]
    metrics = _one(docs, "Service", NAME)
    assert metrics["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "protocol": "TCP", "targetPort": "metrics"}
    ]
    assert metrics["spec"]["selector"] == {"app": NAME}
    webhook = _one(docs, "Service", c.WEBHOOK_SERVICE_NAME)
    assert webhook["spec"]["ports"][0]["port"] == 443
    assert webhook["spec"]["ports"][0]["targetPort"] == "webhook"
    assert webhook["spec"]["selector"] == {"app": NAME}


def test_core_deployment_contract() -> None:
    dep = _one(_docs(K8S / "controller.yaml"), "Deployment", NAME)
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["selector"]["matchLabels"] == {"app": NAME}
    assert spec["template"]["metadata"]["labels"] == {"app": NAME}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    (container,) = pod["containers"]
    assert container["name"] == NAME
    assert container["image"] == "ko://sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"
    assert container["args"] == ["--leader-elect=true"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "healthz": 8081, "webhook": 9443}
    assert "config-volume" not in {v["name"] for v in pod["volumes"]}  # core has no config volume (§2.2)
    # Ours beyond upstream: probes on the health port and a non-root, read-only container.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "healthz"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_extensions_deployment_differs_only_in_args_and_config_volume() -> None:
    core = _one(_docs(K8S / "controller.yaml"), "Deployment", NAME)
    ext = yaml.safe_load((K8S / "extensions.controller.yaml").read_text())
    ext_pod, core_pod = ext["spec"]["template"]["spec"], core["spec"]["template"]["spec"]
    assert ext_pod["containers"][0]["args"] == ["--leader-elect=true", "--extensions"]
    assert {
        "name": "config-volume",
        "configMap": {"name": "agent-sandbox-config", "optional": True},
    } in ext_pod["volumes"]
    mount = {"name": "config-volume", "mountPath": "/etc/sandbox-config", "readOnly": True}
    assert mount in ext_pod["containers"][0]["volumeMounts"]
    # Everything else is the same object.
    ext_pod["containers"][0]["args"] = core_pod["containers"][0]["args"]
    ext_pod["containers"][0]["volumeMounts"].remove(mount)
    ext_pod["volumes"] = [v for v in ext_pod["volumes"] if v["name"] != "config-volume"]
    assert ext == core


def test_webhook_cert_role_matches_the_rbac_source() -> None:
    docs = _docs(K8S / "controller.yaml")
    assert _one(docs, "Role", NAME) == role(NAME, NS, WEBHOOK_CERT_ROLE)


def test_leader_election_role_matches_the_rbac_source() -> None:
    docs = _docs(K8S / "controller.yaml")
    assert _one(docs, "Role", LEADER_ELECTION_NAME) == role(LEADER_ELECTION_NAME, NS, LEADER_ELECTION_ROLE)
    assert _one(docs, "RoleBinding", LEADER_ELECTION_NAME) == role_binding(LEADER_ELECTION_NAME, NS, NS)


def test_bindings_point_at_the_service_account() -> None:
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}]
    core = _one(_docs(K8S / "controller.yaml"), "ClusterRoleBinding", NAME)
    ext = _one(_docs(K8S / "extensions.yaml"), "ClusterRoleBinding", "agent-sandbox-controller-extensions")
    assert core["subjects"] == subject
    assert core["roleRef"]["name"] == NAME
    assert ext["subjects"] == subject
    assert ext["roleRef"]["name"] == "agent-sandbox-controller-extensions"
    assert _docs(K8S / "extensions.yaml") == [ext]  # the file holds only RBAC


def test_router_component_names_and_labels() -> None:
    router = K8S / "router"
    kustomization = yaml.safe_load((router / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    docs = [d for name in kustomization["resources"] for d in _docs(router / name)]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("ServiceAccount", "sandbox-router"),
        ("ClusterRole", "sandbox-router"),
        ("ClusterRoleBinding", "sandbox-router"),
        ("Deployment", "sandbox-router"),
        ("Service", "sandbox-router-svc"),
        ("PodDisruptionBudget", "sandbox-router"),
        ("NetworkPolicy", "sandbox-router"),
    }
    dep = _one(docs, "Deployment", "sandbox-router")
    pod = dep["spec"]["template"]
    # The template controller's managed NetworkPolicy admits exactly this label in this namespace.
    assert pod["metadata"]["labels"]["app"] == "sandbox-router"
    assert dep["metadata"]["namespace"] == NS
    (container,) = pod["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "proxy": 8080,
        "metrics": 9090,
        "healthz": 8081,
    }
    svc = _one(docs, "Service", "sandbox-router-svc")
    assert svc["spec"]["ports"] == [{"name": "proxy", "port": 8080, "protocol": "TCP", "targetPort": "proxy"}]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    cache = _one(docs, "ClusterRole", "sandbox-router")
    # Pods for the cache (spec §1.9); one Sandbox read to tell a claimed pool member from an unclaimed one
    # while its Pod still carries the pool's label (ours, docs/router.md).
    assert cache["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get"]},
    ]


def _components() -> list[Path]:
    return sorted(
        p.parent
        for p in K8S.rglob("kustomization.yaml")
        if yaml.safe_load(p.read_text())["kind"] == "Component"
    )


@pytest.mark.parametrize("component", _components(), ids=lambda p: p.relative_to(K8S).as_posix())
def test_every_selector_patch_has_a_guard_naming_its_target(component: Path) -> None:
    """A `target:` patch that matches nothing is skipped by kustomize without a word, so a component listed
    before the one that adds its object (k8s/router/tokenreview before k8s/router) added its RBAC and not
    its flag: a "tokenreview" router with no authentication (inst12 finding 1). A patch without `target:`
    fails the render when its object is missing, so each selector patch's object is also named by an empty
    guard patch (which changes nothing when the object is there)."""
    patches = yaml.safe_load((component / "kustomization.yaml").read_text()).get("patches") or []
    targets = {(p["target"]["kind"], p["target"]["name"]) for p in patches if "target" in p}
    guards: set[tuple[str, str]] = set()
    for p in patches:
        if "target" in p:
            continue
        guard = yaml.safe_load(p["patch"])
        # Only identity fields: the guard must not change the rendered object.
        assert set(guard) == {"apiVersion", "kind", "metadata"}, guard
        assert set(guard["metadata"]) <= {"name", "namespace"}, guard
        guards.add((guard["kind"], guard["metadata"]["name"]))
    assert targets <= guards, f"selector patches without a guard: {sorted(targets - guards)}"
