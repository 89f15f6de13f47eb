"""A namespace whose Pod Security level the template's Pod does not meet (`pod-security.kubernetes.io/enforce:
restricted`, common on shared clusters): the API server refuses every Pod the controller makes, which no
retry heals. The SDK now fails at once with the admission's message - it names each missing securityContext
field - instead of waiting out `sandbox_ready_timeout` (180 s by default; upstream's SDK waits too)."""

from __future__ import annotations

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClaimFailedError, SandboxClient, SandboxDirectConnectionConfig
from tests.integration.sdk.conftest import EXT, apply_pool

pytestmark = pytest.mark.integration


def test_a_pod_the_namespace_security_level_refuses_fails_the_create_at_once(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    status, out = cluster.admin().request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    assert status == 200, out
    apply_pool(cluster, namespace, replicas=0)  # busybox without a securityContext; claims start cold
    config = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")
    with (
        SandboxClient(config, kubeconfig=cluster.kubeconfig) as client,
        pytest.raises(SandboxClaimFailedError) as info,  # a SandboxTimeoutError on the old code
    ):
        client.create_sandbox("pool", namespace, sandbox_ready_timeout=90)
    assert info.value.reason == "ReconcilerError"
    assert 'violates PodSecurity "restricted:latest"' in str(info.value)
    assert "securityContext.runAsNonRoot=true" in str(info.value)
    status, claims = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
    assert claims["items"] == []  # the auto-named claim was rolled back
