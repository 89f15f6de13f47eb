"""The lifecycle component on a dev cluster (docs/lifecycle.md): its CRD and grants, as `k8s/lifecycle` has them.

`install_lifecycle(cluster)` server-side applies the SandboxArchive CRD and the controller's and router's
lifecycle ClusterRoles and bindings (harmless with the admin identity; needed when the controller runs as
its ServiceAccount), then waits until the CRD is Established and kube-controller-manager's garbage collector
follows SandboxArchives. Idempotent, so every controller or router start with `--sandbox-lifecycle` may call
it on a shared cluster.

Why the garbage-collector wait: the collector learns of a new resource only at its next discovery resync (every
30 s). Until then it does not know an archive as a dependent: a claim deleted with `propagationPolicy: Orphan`
is finalized without orphaning its archive, whose dangling owner reference then gets it deleted - with the
volumes it keeps - once the collector catches up. A fresh cluster that hibernates within 30 s of this install
met that (a CI run's orphaning test did).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from agent_sandbox.api.lifecycle import ARCHIVE
from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.install import InstallError, apply
from agent_sandbox.devcluster.rest import AdminRest
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
    admin = cluster.admin()
    try:
        admin.wait_crds_established([ARCHIVE.crd_name], timeout=timeout)
        wait_garbage_collector_follows_archives(admin, timeout=max(timeout, 90.0))
    except TimeoutError as err:
        raise InstallError(str(err)) from err


_CANARY_NAMESPACE = "default"


def _canary(name: str) -> dict[str, Any]:
    """A SandboxArchive whose only owner never existed: the garbage collector deletes it once it follows the kind.

    The lifecycle controller leaves it alone (an archive without a restore, a claim or a shutdown time is a
    hibernated Sandbox waiting), and it keeps nothing alive (no children).
    """
    return {
        "apiVersion": ARCHIVE.api_version,
        "kind": ARCHIVE.kind,
        "metadata": {
            "name": name,
            "namespace": _CANARY_NAMESPACE,
            "labels": {"app.kubernetes.io/component": "gc-canary"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": str(uuid.uuid4())}
            ],
        },
        "spec": {
            "sandbox": {},
            "sandboxUID": "gc-canary",
            "archivedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }


def wait_garbage_collector_follows_archives(admin: AdminRest, *, timeout: float = 90.0) -> None:
    """Wait until kube-controller-manager's garbage collector acts on SandboxArchives (a canary it deletes).

    Raises:
        TimeoutError: the canary still there after `timeout` seconds (named, so it can be looked at).
    """
    name = f"gc-canary-{uuid.uuid4().hex[:8]}"
    path = ARCHIVE.path(_CANARY_NAMESPACE)
    status, answer = admin.request("POST", path, _canary(name))
    if status != 201:
        raise TimeoutError(f"could not create the garbage-collector canary {name}: {status} {answer}")
    deadline = time.monotonic() + timeout
    while True:
        status, _ = admin.request("GET", f"{path}/{name}")
        if status == 404:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"kube-controller-manager's garbage collector did not delete the SandboxArchive canary "
                f"{_CANARY_NAMESPACE}/{name} within {timeout:.0f} s (is it running? its discovery resync is 30 s)"
            )
        time.sleep(0.2)
