"""The lifecycle component on a dev cluster (docs/lifecycle.md): its CRD and grants, as `k8s/lifecycle` has them.

`install_lifecycle(cluster)` server-side applies the SandboxArchive CRD and the controller's and router's
lifecycle ClusterRoles and bindings (harmless with the admin identity; needed when the controller runs as
its ServiceAccount), then waits until the CRD is Established. Idempotent, so every controller or router
start with `--sandbox-lifecycle` may call it on a shared cluster.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from agent_sandbox.api.lifecycle import ARCHIVE
from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.install import InstallError, apply
from agent_sandbox.manifests import REPO_ROOT

__all__ = ["install_lifecycle", "lifecycle_requested"]

_FILES = (
    Path("k8s/lifecycle") / f"{ARCHIVE.group}_{ARCHIVE.plural}.yaml",
    Path("k8s/lifecycle/rbac.generated.yaml"),
    Path("k8s/lifecycle/rbac-binding.yaml"),
    Path("k8s/router/lifecycle/rbac.generated.yaml"),
    Path("k8s/router/lifecycle/rbac-binding.yaml"),
)


def lifecycle_requested(argv: tuple[str, ...] | list[str]) -> bool:
    """`--sandbox-lifecycle` (or `=true`) among a controller's or router's arguments."""
    return any(a.lstrip("-") in ("sandbox-lifecycle", "sandbox-lifecycle=true") for a in argv)


def install_lifecycle(cluster: DevCluster, timeout: float = 60.0) -> None:
    """Apply the lifecycle CRD and grants and wait for the CRD (InstallError on failure)."""
    docs = [d for rel in _FILES for d in yaml.safe_load_all((REPO_ROOT / rel).read_text()) if d]
    apply(cluster, docs, field_manager="agent-sandbox-lifecycle")
    try:
        cluster.admin().wait_crds_established([ARCHIVE.crd_name], timeout=timeout)
    except TimeoutError as err:
        raise InstallError(str(err)) from err
