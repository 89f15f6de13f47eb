"""The router component (k8s/router, sdk-router-runtime §1.15) installed next to the controller: its pods run
`agent-sandbox-router` with the manifest's flags as the `sandbox-router` ServiceAccount (Pod-IP cache on, so
the ClusterRole must allow listing pods), and pass their readiness probe; the proxy port answers /healthz and
the metrics port serves the router's metrics."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path

import pytest

from agent_sandbox.devcluster.install import apply, kustomize
from agent_sandbox_sdk import SandboxClient, SandboxLocalTunnelConnectionConfig
from tests.go_examples import run_go_basic
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.install.conftest import RAW_SELECTOR, Installed, write_overlay
from tests.upstream_sdk import DEFAULT_MODE_JOURNEY, ensure_upstream_sdk, run_script

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


def _router_pods_and_pool(installed: Installed, namespace: str, tmp_path: Path) -> None:
    """The router component's two pods Ready, and the warm pool `pool` of runtimes in `namespace`."""
    overlay = write_overlay(tmp_path / "overlay", ["router"])
    apply(installed.cluster, kustomize(installed.cluster, overlay))
    installed.controller_pods(RAW_SELECTOR)
    installed.controller_pods(ROUTER, count=2)
    pool = tmp_path / "pool.yaml"
    pool.write_text(_POOL_YAML)
    installed.cluster.kubectl("apply", "-n", namespace, "-f", str(pool), check=True)


def test_upstream_sdks_default_tunnel_reaches_sandboxes_through_the_installed_router(
    installed: Installed, install_ns: str, tmp_path: Path
) -> None:
    """Upstream's published SDK with no connection config (its default mode): `kubectl port-forward
    svc/sandbox-router-svc -n agent-sandbox-system` -> the API server's pods/portforward -> kwok -> an installed
    router pod's process -> the sandbox's runtime on its pod IP. Then ours in the same mode."""
    _router_pods_and_pool(installed, install_ns, tmp_path)
    kubectl_dir = str(installed.cluster.binaries.path("kubectl").parent)
    env = {
        **os.environ,
        "KUBECONFIG": str(installed.cluster.kubeconfig),
        "PATH": f"{kubectl_dir}{os.pathsep}{os.environ['PATH']}",
    }
    out = json.loads(
        asyncio.run(
            run_script(
                ensure_upstream_sdk(),
                DEFAULT_MODE_JOURNEY,
                install_ns,
                "through the router pod",
                env=env,
                timeout=180,
            )
        )
    )
    assert out == {"run": ["through the router pod\n", 0], "read": "hi"}

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        config = SandboxLocalTunnelConnectionConfig()
        with SandboxClient(config, kubeconfig=installed.cluster.kubeconfig) as client:
            sandbox = client.create_sandbox("pool", install_ns, sandbox_ready_timeout=90)
            assert sandbox.commands is not None
            assert sandbox.commands.run("echo ours").stdout == "ours\n"
            sandbox.terminate()


def test_go_sdks_router_port_forward_reaches_sandboxes_through_the_installed_router(
    installed: Installed, install_ns: str, tmp_path: Path
) -> None:
    """The Go SDK's default mode (no router URL): a SPDY port-forward through the API server to a Pod of
    `sandbox-router-svc`, found here by the Service's selector because no EndpointSlice can list a 127.x Pod
    (clients/go `routerPod`), then the router pod's process -> the sandbox's runtime. Runs the SDK's own
    `examples/basic` unchanged but for the router namespace."""
    _router_pods_and_pool(installed, install_ns, tmp_path)
    stdout = run_go_basic(
        tmp_path, installed.cluster.kubeconfig, "-pool", "pool", "-namespace", install_ns,
        "-router-namespace", "agent-sandbox-system",
    )  # fmt: skip
    # The example deletes its claim on the way out: gone, or at least being deleted.
    claim = stdout.split()[1]
    left = installed.cluster.kubectl(
        "get", "sandboxclaims", claim, "-n", install_ns, "--ignore-not-found", "-o", "json", check=True
    ).stdout
    assert not left.strip() or json.loads(left)["metadata"].get("deletionTimestamp"), left


_POOL_YAML = f"""
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {{name: rt}}
spec:
  podTemplate:
    spec:
      containers: [{{name: runtime, image: {RUNTIME_IMAGE}}}]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {{name: pool}}
spec: {{replicas: 2, sandboxTemplateRef: {{name: rt}}}}
"""
