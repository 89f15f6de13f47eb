"""The CLI tests use the SDK tests' router fixture (one process per module), and kubeconfigs of roles."""

from __future__ import annotations

from pathlib import Path

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.install import token_kubeconfig
from tests.integration.sdk.conftest import router

__all__ = ["role_kubeconfig", "router"]


def role_kubeconfig(
    cluster: DevCluster, namespace: str, account: str, rules: list[dict[str, object]], directory: Path
) -> Path:
    """A kubeconfig of a new ServiceAccount `account` bound to a Role of `rules` (it may take a moment to
    apply: the authorizer learns of bindings from its informer)."""
    admin = cluster.admin()
    ns_path = f"/api/v1/namespaces/{namespace}"
    assert admin.request("POST", f"{ns_path}/serviceaccounts", {"metadata": {"name": account}})[0] == 201
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    assert admin.request("POST", f"{rbac}/roles", {"metadata": {"name": account}, "rules": rules})[0] == 201
    binding = {
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    assert admin.request("POST", f"{rbac}/rolebindings", binding)[0] == 201
    return token_kubeconfig(cluster, namespace, account, directory / f"{account}.kubeconfig")
