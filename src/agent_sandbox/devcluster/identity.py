"""Which identity the dev-mode controller runs as: the admin, or the install's ServiceAccount.

`controller_kubeconfig(cluster)` is what `devcluster.controller` passes as `--kubeconfig`. With
`AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount` (CI sets it in `hack/test.sh`) the controller
authenticates as `agent-sandbox-system/agent-sandbox-controller` with a service-account token, RBAC on,
holding exactly the grants the install renders (`kubectl kustomize k8s/`: the ServiceAccount, both
ClusterRoles and bindings, the webhook-certificate Role). The RBAC objects are re-applied on every call,
so a test that removed a rule cannot leak its change into the next controller start. The default,
`admin`, is the cluster's admin kubeconfig (system:masters, no RBAC checks).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.install import apply, kustomize, token_kubeconfig
from agent_sandbox.manifests import (
    CONTROLLER_NAME,
    LEADER_ELECTION_NAME,
    LEADER_ELECTION_ROLE,
    REPO_ROOT,
    role,
    role_binding,
)

__all__ = [
    "IDENTITIES",
    "IDENTITY_ENV",
    "chosen_identity",
    "controller_kubeconfig",
    "grant_leader_election",
    "install_controller_rbac",
]

IDENTITY_ENV: Final = "AGENT_SANDBOX_CONTROLLER_IDENTITY"
IDENTITIES: Final = ("admin", "serviceaccount")
CONTROLLER_NAMESPACE: Final = "agent-sandbox-system"
_RBAC_KINDS: Final = (
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
)


def chosen_identity(identity: str | None = None) -> str:
    """`identity`, else `$AGENT_SANDBOX_CONTROLLER_IDENTITY`, else `admin` (one of IDENTITIES).

    Raises:
        ValueError: an unknown identity.
    """
    chosen = identity or os.environ.get(IDENTITY_ENV) or "admin"
    if chosen not in IDENTITIES:
        raise ValueError(f"{IDENTITY_ENV} must be one of {', '.join(IDENTITIES)}, not {chosen!r}")
    return chosen


def install_controller_rbac(cluster: DevCluster) -> None:
    """Apply the install's identity objects (Namespace, ServiceAccount, RBAC) as `kubectl apply -k k8s/` would."""
    docs = [d for d in kustomize(cluster, REPO_ROOT / "k8s") if d["kind"] in _RBAC_KINDS]
    apply(cluster, docs, field_manager="agent-sandbox-identity")


def grant_leader_election(cluster: DevCluster, namespace: str) -> None:
    """Bind the install's leader-election Role in `namespace` too, as an admin must for a
    `--leader-election-namespace` other than the controller's (the install grants Leases only there)."""
    docs = [
        role(LEADER_ELECTION_NAME, namespace, LEADER_ELECTION_ROLE),
        role_binding(LEADER_ELECTION_NAME, namespace, CONTROLLER_NAMESPACE),
    ]
    apply(cluster, docs, field_manager="agent-sandbox-identity")


def controller_kubeconfig(cluster: DevCluster, identity: str | None = None) -> Path:
    """The kubeconfig the dev-mode controller uses (`identity` defaults to `$AGENT_SANDBOX_CONTROLLER_IDENTITY`).

    Raises:
        ValueError: an unknown identity.
        InstallError: the RBAC or the token could not be installed.
    """
    if chosen_identity(identity) == "admin":
        return cluster.kubeconfig
    install_controller_rbac(cluster)
    # A fresh token every time: one issued earlier dies with its ServiceAccount, which a test that
    # uninstalled and reinstalled the RBAC has replaced. Written aside and renamed, so a controller
    # reading the file meanwhile sees the old or the new one whole.
    path = cluster.directory / f"{CONTROLLER_NAME}.kubeconfig"
    fresh = token_kubeconfig(cluster, CONTROLLER_NAMESPACE, CONTROLLER_NAME, path.with_suffix(".new"))
    fresh.replace(path)
    return path
