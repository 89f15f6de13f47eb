"""Least privilege, proven (operations §2.3): with one grant of the installed RBAC missing, the controller
surfaces the 403 (a logged, retried error), keeps running, and converges once the grant is back.

The controller runs as the installed ServiceAccount (`AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount`),
on the install cluster. Each case revokes one (group, resource, verb) grant from both ClusterRoles exactly
(the rest of each rule stays), checks with a SubjectAccessReview that it is gone, creates objects that need
it, and restores the installed RBAC. The whole controller suite also runs under this identity in CI
(hack/test.sh), which shows the grants are sufficient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.identity import install_controller_rbac
from agent_sandbox.devcluster.processes import Started, is_ours
from tests.helpers import wait_for
from tests.integration.install.conftest import sa_controller
from tests.integration.install.rbac import Grant, allowed, revoke, wait_for_quietly, without

pytestmark = pytest.mark.integration

EXT = "extensions.agents.x-k8s.io/v1beta1"


# -- the cases -------------------------------------------------------------------------------------------
def _sandbox(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}, **spec},
    }


def _template() -> dict[str, Any]:
    return {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": "tmpl"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }


def _pool() -> dict[str, Any]:
    return {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "pool"},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "tmpl"}},
    }


def _claim() -> dict[str, Any]:
    return {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "metadata": {"name": "claim"},
        "spec": {"warmPoolRef": {"name": "pool"}},
    }


_PLURALS = {
    "Sandbox": "sandboxes",
    "SandboxTemplate": "sandboxtemplates",
    "SandboxWarmPool": "sandboxwarmpools",
}
_PLURALS["SandboxClaim"] = "sandboxclaims"


def _ready(cluster: DevCluster, ns: str, kind: str, name: str) -> bool:
    group = "agents.x-k8s.io" if kind == "Sandbox" else "extensions.agents.x-k8s.io"
    status, obj = cluster.admin().request(
        "GET", f"/apis/{group}/v1beta1/namespaces/{ns}/{_PLURALS[kind]}/{name}"
    )
    conds = {c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or ()}
    return status == 200 and conds.get("Ready") == "True"


def _exists(cluster: DevCluster, path: str) -> bool:
    return cluster.admin().request("GET", path)[0] == 200


@dataclass(frozen=True)
class Case:
    id: str
    grants: tuple[Grant, ...]
    objects: tuple[dict[str, Any], ...]
    logged: str  # text of the 403 the controller must log (and retry)
    done: Callable[[DevCluster, str], bool]
    blocked: bool = True  # False: the work completes without the grant (best-effort writes)


CASES = (
    Case(
        "pods/create",
        (("", "pods", "create"),),
        (_sandbox("sb"),),
        'cannot create resource "pods"',
        lambda c, ns: _ready(c, ns, "Sandbox", "sb"),
    ),
    Case(
        "services/create",
        (("", "services", "create"),),
        (_sandbox("sb", service=True),),
        'cannot create resource "services"',
        lambda c, ns: _ready(c, ns, "Sandbox", "sb") and _exists(c, f"/api/v1/namespaces/{ns}/services/sb"),
    ),
    Case(
        "persistentvolumeclaims/create",
        (("", "persistentvolumeclaims", "create"),),
        (
            _sandbox(
                "sb",
                volumeClaimTemplates=[
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                ],
            ),
        ),
        'cannot create resource "persistentvolumeclaims"',
        lambda c, ns: _ready(c, ns, "Sandbox", "sb"),
    ),
    Case(
        "sandboxes/status",
        (("agents.x-k8s.io", "sandboxes/status", "patch"), ("agents.x-k8s.io", "sandboxes/status", "update")),
        (_sandbox("sb"),),
        'resource "sandboxes/status"',
        lambda c, ns: _ready(c, ns, "Sandbox", "sb"),
    ),
    Case(
        "networkpolicies/create",
        (("networking.k8s.io", "networkpolicies", "create"),),
        (_template(),),
        'cannot create resource "networkpolicies"',
        lambda c, ns: _exists(
            c, f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/tmpl-network-policy"
        ),
    ),
    Case(
        "sandboxclaims/status",
        (
            ("extensions.agents.x-k8s.io", "sandboxclaims/status", "patch"),
            ("extensions.agents.x-k8s.io", "sandboxclaims/status", "update"),
        ),
        (_template(), _pool(), _claim()),
        'resource "sandboxclaims/status"',
        lambda c, ns: _ready(c, ns, "SandboxClaim", "claim"),
    ),
    Case(
        "events/create",
        (("events.k8s.io", "events", "create"), ("", "events", "create")),
        (_template(), _pool(), _claim()),
        'cannot create resource "events"',
        lambda c, ns: _ready(c, ns, "SandboxClaim", "claim"),
        blocked=False,  # events are best effort: the claim gets Ready; the drop is logged
    ),
)


@pytest.fixture(scope="module")
def controller(install_cluster: DevCluster) -> Iterator[Started]:
    """One controller for the module, as the installed ServiceAccount (dev-mode listeners)."""
    with sa_controller(install_cluster) as started:
        yield started


def _create(cluster: DevCluster, ns: str, obj: dict[str, Any]) -> None:
    kind = obj["kind"]
    group = obj["apiVersion"].rsplit("/", 1)[0]
    status, body = cluster.admin().request(
        "POST", f"/apis/{group}/v1beta1/namespaces/{ns}/{_PLURALS[kind]}", obj
    )
    assert status == 201, body


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_missing_grant_is_logged_retried_and_recovered(
    install_cluster: DevCluster, controller: Started, install_ns: str, case: Case
) -> None:
    cluster, ns = install_cluster, install_ns
    offset = controller.log.stat().st_size
    revoke(cluster, case.grants)
    try:
        for grant in case.grants:
            assert not allowed(cluster, grant, ns), grant
        for obj in case.objects:
            _create(cluster, ns, obj)

        def logged_twice() -> bool:
            # JSON log lines escape the quotes of the API server's message.
            text = controller.log.read_bytes()[offset:].decode(errors="replace").replace('\\"', '"')
            return text.count(case.logged) >= (2 if case.blocked else 1)

        if not wait_for_quietly(logged_twice, timeout=30):
            tail = controller.log.read_bytes()[offset:].decode(errors="replace")[-3000:]
            pytest.fail(f"the controller did not log (and retry) {case.logged!r}; its log since:\n{tail}")
        assert is_ours(controller.pid, controller.exe), "the controller exited"
        if case.blocked:
            assert not case.done(cluster, ns), "the work completed without the grant"
    finally:
        install_controller_rbac(cluster)
    for grant in case.grants:
        # The RBAC authorizer reads roles from an informer: a restored rule takes effect a moment later.
        wait_for(lambda g=grant: allowed(cluster, g, ns), timeout=15, what=f"{grant} granted again")
    wait_for(
        lambda: case.done(cluster, ns), timeout=60, what=f"{case.id}: convergence once the grant is back"
    )
    assert is_ours(controller.pid, controller.exe), "the controller restarted or exited"


def test_revocation_helper_removes_exactly_one_grant() -> None:
    rules = [{"apiGroups": ["", "x"], "resources": ["a", "b"], "verbs": ["get", "list"]}]
    got = without(rules, ("", "a", "get"))
    grants = {
        (g, r, v) for rule in got for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    every = {(g, r, v) for g in ("", "x") for r in ("a", "b") for v in ("get", "list")}
    assert grants == every - {("", "a", "get")}
