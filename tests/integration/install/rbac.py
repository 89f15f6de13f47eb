"""RBAC helpers for the least-privilege tests: revoke exactly one grant, ask the API server about it."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.install import apply, kustomize
from agent_sandbox.manifests import CONTROLLER_NAME, EXTENSIONS_NAME, REPO_ROOT

USER = "system:serviceaccount:agent-sandbox-system:agent-sandbox-controller"
Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)


def without(rules: list[dict[str, Any]], grant: Grant) -> list[dict[str, Any]]:
    """`rules` minus exactly one grant: every other group, resource and verb of each rule is kept."""
    group, resource, verb = grant
    out: list[dict[str, Any]] = []
    for rule in rules:
        if group not in rule["apiGroups"] or resource not in rule["resources"] or verb not in rule["verbs"]:
            out.append(rule)
            continue
        others = {k: v for k, v in rule.items() if k not in ("apiGroups", "resources", "verbs")}
        rest_groups = [g for g in rule["apiGroups"] if g != group]
        rest_resources = [r for r in rule["resources"] if r != resource]
        rest_verbs = [v for v in rule["verbs"] if v != verb]
        if rest_groups:
            out.append(
                {**others, "apiGroups": rest_groups, "resources": rule["resources"], "verbs": rule["verbs"]}
            )
        if rest_resources:
            out.append({**others, "apiGroups": [group], "resources": rest_resources, "verbs": rule["verbs"]})
        if rest_verbs:
            out.append({**others, "apiGroups": [group], "resources": [resource], "verbs": rest_verbs})
    return out


def wait_for_quietly(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def allowed(cluster: DevCluster, grant: Grant, namespace: str, name: str = "") -> bool:
    """SubjectAccessReview: may the controller's ServiceAccount use `grant` in `namespace` (on object `name`)?"""
    group, resource, verb = grant
    res, _, sub = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": USER,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:agent-sandbox-system"],
            "resourceAttributes": {
                "group": group,
                "resource": res,
                "subresource": sub,
                "verb": verb,
                "namespace": namespace,
                "name": name,
            },
        },
    }
    status, body = cluster.admin().request(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    assert status == 201, body
    return bool(body["status"]["allowed"])


def revoke(cluster: DevCluster, grants: tuple[Grant, ...]) -> None:
    roles = [
        copy.deepcopy(d)
        for d in kustomize(cluster, REPO_ROOT / "k8s")
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] in (CONTROLLER_NAME, EXTENSIONS_NAME)
    ]
    for role in roles:
        for grant in grants:
            role["rules"] = without(role["rules"], grant)
    apply(cluster, roles, field_manager="agent-sandbox-identity")
    # The RBAC authorizer reads roles from an informer, so the revocation takes effect a moment after the
    # write (a loaded CI box once answered the SubjectAccessReview right after it with the old rule).
    deadline = time.monotonic() + 15
    while any(allowed(cluster, grant, "") for grant in grants) and time.monotonic() < deadline:
        time.sleep(0.05)
