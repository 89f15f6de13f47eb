"""The real API server's two kinds of 404, as the SDK reads them: an absent object (a `Status` body, the SDK
answers "absent") and an API the server does not serve (plain text: the CRDs are not installed; the SDK
raises an error that says so instead of reporting the object as not found)."""

from __future__ import annotations

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxRequestError
from agent_sandbox_sdk._kube import CLAIMS, KubeResource, delete, get

pytestmark = pytest.mark.integration

UNSERVED = KubeResource("unserved.agents.x-k8s.io", "v1", "sandboxclaims")


def test_absent_object_and_unserved_api(cluster: DevCluster, namespace: str, controller: Started) -> None:
    """(The controller fixture installs the CRDs.)"""
    with SandboxClient(kubeconfig=cluster.kubeconfig) as client:
        run = client._driver.run
        assert run(get(CLAIMS, namespace, "absent")) is None
        assert run(delete(CLAIMS, namespace, "absent")) is False
        for flow in (get(UNSERVED, namespace, "x"), delete(UNSERVED, namespace, "x")):
            with pytest.raises(
                SandboxRequestError, match=r"this API is not served: are the agent-sandbox CRDs"
            ):
                run(flow)
