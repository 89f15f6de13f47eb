"""With the CRDs installed but no controller running (stopped, crashed, or a namespace-scoped install that does
not watch this namespace), a create waits its timeout and then says what is missing: until December 6 it said
only "no Ready condition yet", which reads like a slow pool."""

from __future__ import annotations

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, SandboxTimeoutError

pytestmark = pytest.mark.integration


def test_a_claim_nobody_answers_names_the_controller(cluster: DevCluster, namespace: str) -> None:
    install_crds(cluster)
    config = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")
    with (
        SandboxClient(config, kubeconfig=cluster.kubeconfig) as client,
        pytest.raises(SandboxTimeoutError) as info,
    ):
        client.create_sandbox("pool", namespace, sandbox_ready_timeout=2)
    assert str(info.value).endswith(
        " - nothing wrote its status: is the agent-sandbox controller running, and watching this namespace?"
    )
