"""Install surfaces as data: the controller's RBAC (one source), generated files, release assets.

Pure apart from reading and writing files of the source checkout; rendering kustomizations is delegated
to a caller-supplied ``kubectl kustomize``. The manifests themselves live in ``k8s/`` and ``helm/``;
docs/install.md explains how they are used.
"""

from __future__ import annotations

from agent_sandbox.manifests.generated import REPO_ROOT, check, generated_files, write
from agent_sandbox.manifests.rbac import (
    CONTROLLER_NAME,
    CORE_RULES,
    EXTENSIONS_NAME,
    EXTENSIONS_RULES,
    LEADER_ELECTION_NAME,
    LEADER_ELECTION_ROLE,
    LEASE_NAME,
    WEBHOOK_CERT_ROLE,
    Rule,
    cluster_role,
    render_cluster_role,
    role,
    role_binding,
)
from agent_sandbox.manifests.release import (
    CONTROLLER_PLACEHOLDER,
    DEFAULT_REGISTRY,
    ROUTER_PLACEHOLDER,
    Assets,
    DriftError,
    check_drift,
    install_files,
    render_assets,
    router_files,
    substitute_images,
)

__all__ = [
    "CONTROLLER_NAME",
    "CONTROLLER_PLACEHOLDER",
    "CORE_RULES",
    "DEFAULT_REGISTRY",
    "EXTENSIONS_NAME",
    "EXTENSIONS_RULES",
    "LEADER_ELECTION_NAME",
    "LEADER_ELECTION_ROLE",
    "LEASE_NAME",
    "REPO_ROOT",
    "ROUTER_PLACEHOLDER",
    "WEBHOOK_CERT_ROLE",
    "Assets",
    "DriftError",
    "Rule",
    "check",
    "check_drift",
    "cluster_role",
    "generated_files",
    "install_files",
    "render_assets",
    "render_cluster_role",
    "role",
    "role_binding",
    "router_files",
    "substitute_images",
    "write",
]
