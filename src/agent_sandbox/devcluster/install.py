"""Install the project into a dev cluster the way users do: `kubectl kustomize`/`apply`, `helm`.

Owns: rendering a kustomization with the cluster's own kubectl, server-side applying documents, running the
built helm against the cluster (with its config and cache kept inside the cluster directory), and the
service-account credentials an installed workload would get (TokenRequest, optionally bound to its Pod).
The processes of installed pods are run by `podprocess`; the controller identity switch for tests is in
`identity`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from agent_sandbox.devcluster.cluster import DevCluster

__all__ = ["InstallError", "apply", "helm", "kustomize", "token_kubeconfig"]


class InstallError(RuntimeError):
    """A render, apply, helm or token request failed; the message holds the tool's own error."""


def kustomize(cluster: DevCluster, directory: Path) -> list[dict[str, Any]]:
    """The documents `kubectl kustomize <directory>` renders."""
    out = cluster.kubectl("kustomize", str(directory))
    if out.returncode != 0:
        raise InstallError(f"kubectl kustomize {directory} failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def apply(cluster: DevCluster, docs: Iterable[Mapping[str, Any]], *, field_manager: str = "install") -> str:
    """Server-side apply `docs` (conflicts forced, as the upgrade guide says); returns kubectl's output."""
    bundle = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)})
    out = cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={field_manager}",
        "-f",
        "-",
        input=bundle,
    )
    if out.returncode != 0:
        raise InstallError(f"kubectl apply failed: {out.stderr.strip()}")
    return out.stdout


def helm(cluster: DevCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the built helm against `cluster`; its config, cache and data stay in the cluster directory."""
    home = cluster.directory / "helm"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HELM_NAMESPACE")},
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    argv = [str(cluster.binaries.path("helm")), f"--kubeconfig={cluster.kubeconfig}", *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if check and out.returncode != 0:
        raise InstallError(f"helm {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def token_kubeconfig(
    cluster: DevCluster,
    namespace: str,
    service_account: str,
    path: Path,
    *,
    pod: Mapping[str, Any] | None = None,
    expiration_seconds: int = 86400,
) -> Path:
    """Write a kubeconfig that authenticates as `namespace/service_account` with a requested token.

    With `pod`, the token is bound to that Pod (as the kubelet's projected token is): it stops working
    once the Pod is deleted.

    Raises:
        InstallError: the TokenRequest was refused (e.g. no such ServiceAccount).
    """
    spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    status, body = cluster.admin().request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    if status != 201:
        raise InstallError(f"TokenRequest for {namespace}/{service_account}: HTTP {status}: {body}")
    name, user = f"agent-sandbox-{cluster.name}", f"system:serviceaccount:{namespace}:{service_account}"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": cluster.server, "certificate-authority": str(_ca(cluster))}}
        ],
        "users": [{"name": user, "user": {"token": body["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


def _ca(cluster: DevCluster) -> Path:
    return cluster.directory / "pki" / "ca.crt"
