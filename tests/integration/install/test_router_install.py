"""The router component (k8s/router, sdk-router-runtime §1.15) installed next to the controller: its pods run
`agent-sandbox-router` with the manifest's flags as the `sandbox-router` ServiceAccount (Pod-IP cache on, so
the ClusterRole must allow listing pods), and pass their readiness probe; the proxy port answers /healthz and
the metrics port serves the router's metrics."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from agent_sandbox.devcluster.install import apply, kustomize
from tests.integration.install.conftest import RAW_SELECTOR, Installed, write_overlay

pytestmark = pytest.mark.integration

ROUTER = {"app.kubernetes.io/name": "sandbox-router", "app.kubernetes.io/component": "sandbox-router"}


def test_router_component_runs_ready(installed: Installed, tmp_path: Path) -> None:
    overlay = write_overlay(tmp_path / "overlay", ["router"])
    apply(installed.cluster, kustomize(installed.cluster, overlay))
    installed.controller_pods(RAW_SELECTOR)
    routers = installed.controller_pods(ROUTER, count=2)
    for pod in routers:
        ip = pod["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:8080/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://{ip}:9090/metrics", timeout=5) as resp:
            assert "sandbox_router_" in resp.read().decode()
