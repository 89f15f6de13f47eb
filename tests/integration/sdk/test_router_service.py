"""The dev router behind `sandbox-router-svc` (`devcluster.router_service`, what `dev up --router` and `make demo`
do): upstream's published SDK with no connection config - `kubectl port-forward svc/sandbox-router-svc -n
agent-sandbox-system` - and the Go SDK's router port-forward reach sandboxes through the dev cluster's host router,
as they would through an installed one."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.devcluster.router_service import NAMESPACE, SERVICE, RouterServiceError, expose_router
from tests.go_examples import run_go_basic
from tests.upstream_sdk import DEFAULT_MODE_JOURNEY, ensure_upstream_sdk, run_script

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def exposed(cluster: DevCluster, router: str) -> Iterator[None]:
    """The module's dev router exposed; the Service and its Pod removed afterwards."""
    expose_router(cluster)
    expose_router(cluster)  # idempotent
    deadline = time.monotonic() + 60
    while True:
        status, pod = cluster.admin().request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods/sandbox-router-dev"
        )
        if status == 200 and (pod.get("status") or {}).get("phase") == "Running":
            break
        assert time.monotonic() < deadline, f"placeholder pod not Running: {status} {pod}"
        time.sleep(0.2)
    yield
    cluster.kubectl("delete", "-n", NAMESPACE, f"service/{SERVICE}", "pod/sandbox-router-dev", "--wait=false")


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=2, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def _env(cluster: DevCluster) -> dict[str, str]:
    kubectl_dir = str(cluster.binaries.path("kubectl").parent)
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": f"{kubectl_dir}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("AGENT_SANDBOX_ROUTER_URL", None)
    return env


def test_upstream_sdks_default_mode_reaches_sandboxes_through_the_dev_router(
    cluster: DevCluster, exposed: None, pool: str
) -> None:
    out = json.loads(
        asyncio.run(
            run_script(
                ensure_upstream_sdk(),
                DEFAULT_MODE_JOURNEY,
                pool,
                "through the dev router service",
                env=_env(cluster),
            )
        )
    )
    assert out == {"run": ["through the dev router service\n", 0], "read": "hi"}


def test_go_sdks_router_port_forward_reaches_sandboxes_through_the_dev_router(
    cluster: DevCluster, exposed: None, pool: str, tmp_path: Path
) -> None:
    run_go_basic(
        tmp_path, cluster.kubeconfig, "-pool", "pool", "-namespace", pool, "-router-namespace", NAMESPACE
    )


def test_a_service_that_is_not_ours_is_left_alone(cluster: DevCluster, exposed: None) -> None:
    mark = "agent-sandbox.dev/host-router"
    cluster.kubectl("label", "-n", NAMESPACE, f"service/{SERVICE}", f"{mark}-", check=True)
    try:
        with pytest.raises(RouterServiceError, match="is not the dev router's"):
            expose_router(cluster)
    finally:
        cluster.kubectl("label", "-n", NAMESPACE, f"service/{SERVICE}", f"{mark}=true", check=True)
