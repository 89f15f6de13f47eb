"""The controller identity switch: `serviceaccount` authenticates as the installed ServiceAccount with exactly
the installed grants (RBAC on); `admin` is the admin kubeconfig."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.devcluster.identity import controller_kubeconfig

pytestmark = pytest.mark.integration


def _kubectl(cluster: DevCluster, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(argv, capture_output=True, text=True)


def test_serviceaccount_identity_has_only_the_installed_grants(cluster: DevCluster, namespace: str) -> None:
    install_crds(cluster)
    kubeconfig = controller_kubeconfig(cluster, "serviceaccount")
    assert kubeconfig != cluster.kubeconfig
    who = json.loads(_kubectl(cluster, kubeconfig, "auth", "whoami", "-o", "json").stdout)
    assert who["status"]["userInfo"]["username"] == (
        "system:serviceaccount:agent-sandbox-system:agent-sandbox-controller"
    )
    for verb, resource, expected in (
        ("create", "pods", "yes"),
        ("patch", "sandboxes.agents.x-k8s.io", "yes"),
        ("create", "networkpolicies.networking.k8s.io", "yes"),
        ("list", "secrets", "no"),  # only the webhook Secret in agent-sandbox-system
        ("create", "deployments.apps", "no"),
        ("delete", "nodes", "no"),
    ):
        out = _kubectl(cluster, kubeconfig, "auth", "can-i", verb, resource, "-n", namespace)
        assert out.stdout.strip() == expected, (verb, resource, out.stdout, out.stderr)


def test_admin_is_the_default(cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_SANDBOX_CONTROLLER_IDENTITY", raising=False)
    assert controller_kubeconfig(cluster) == cluster.kubeconfig
    monkeypatch.setenv("AGENT_SANDBOX_CONTROLLER_IDENTITY", "root")
    with pytest.raises(
        ValueError, match="AGENT_SANDBOX_CONTROLLER_IDENTITY must be one of admin, serviceaccount"
    ):
        controller_kubeconfig(cluster)
