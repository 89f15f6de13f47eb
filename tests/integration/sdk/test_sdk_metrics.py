"""The SDK's `get_metrics()` after real creates (spec §3.12): endpoint discovery is recorded for a kubectl
tunnel to the sandbox pod (`mode="sandboxd_pod_tunnel"`, `kubectl port-forward pod/<pod>` through the dev
cluster's API server and kwok), sync and async, and not for a mode that discovers nothing (pod IP).
The Gateway mode's discovery is covered by the unit tests (clients/python/tests/unit/test_discovery_metrics.py).
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxdInClusterConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
    get_metrics,
)

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NAME = "sandbox_client_discovery_latency_ms"


def _count(mode: str, status: str = "success") -> float:
    found = re.search(
        rf'^{NAME}_count\{{mode="{mode}",status="{status}"\}} (\S+)$', get_metrics(), re.MULTILINE
    )
    return float(found.group(1)) if found else 0.0


def _discoveries() -> float:
    return sum(
        float(v) for v in re.findall(rf"^{NAME}_count\{{[^}}]*\}} (\S+)$", get_metrics(), re.MULTILINE)
    )


@pytest.fixture(autouse=True)
def kubectl_on_path(cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tunnel mode runs `kubectl port-forward`, found on PATH: the cluster's own."""
    monkeypatch.setenv("PATH", f"{cluster.binaries.path('kubectl').parent}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=2, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def test_a_pod_tunnel_records_its_discovery_sync_and_async(cluster: DevCluster, pool: str) -> None:
    config = SandboxdPodTunnelConnectionConfig()
    # The SDK's metrics are process-global: a test run earlier in this process (a unit test of a dying tunnel,
    # say) may already have recorded discoveries of this mode, failures too. Only this test's are asserted on.
    before = _count("sandboxd_pod_tunnel")
    failures = _count("sandboxd_pod_tunnel", "failure")
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        for _ in range(3):  # one tunnel, started by the first call and reused
            assert sandbox.commands.run("echo hi").stdout == "hi\n"
        sandbox.terminate()
    assert _count("sandboxd_pod_tunnel") == before + 1
    text = get_metrics()
    assert "# TYPE sandbox_client_discovery_latency_ms histogram" in text
    bucket = (
        'sandbox_client_discovery_latency_ms_bucket{mode="sandboxd_pod_tunnel",status="success",le="750.0"}'
    )
    assert bucket in text

    async def run_async() -> None:
        async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as aclient:
            sb = await aclient.create_sandbox("pool", pool, sandbox_ready_timeout=90)
            assert sb.commands is not None
            assert (await sb.commands.run("echo hi")).stdout == "hi\n"
            await sb.terminate()

    asyncio.run(run_async())
    assert _count("sandboxd_pod_tunnel") == before + 2
    assert _count("sandboxd_pod_tunnel", "failure") == failures


def test_a_mode_that_discovers_nothing_records_nothing(cluster: DevCluster, pool: str) -> None:
    before = _discoveries()
    with SandboxClient(
        SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip"), kubeconfig=cluster.kubeconfig
    ) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        assert sandbox.commands.run("echo hi").stdout == "hi\n"
        sandbox.terminate()
    assert _discoveries() == before
    assert 'sandbox_client_create_latency_ms_count{status="success"}' in get_metrics()
