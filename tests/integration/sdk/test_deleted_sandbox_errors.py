"""A call on a sandbox whose claim was deleted behind the handle's back, through the real router: the error is
`SandboxNotFoundError` (the documented tree: "claim/sandbox missing, deleted") and still the
`SandboxRequestError` it was (upstream's callers catch that), with the router's 502 kept. Until December 7 it
was a plain `SandboxRequestError` that only its message told from a transient 502 (probe faults10)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    SandboxClient,
    SandboxDeletedError,
    SandboxDirectConnectionConfig,
    SandboxNotFoundError,
    SandboxRequestError,
)
from tests.helpers import wait_for

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def test_calls_on_a_sandbox_whose_claim_was_deleted_are_not_found(
    cluster: DevCluster, pool: str, router: str
) -> None:
    admin = cluster.admin()
    config = SandboxDirectConnectionConfig(api_url=router)
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        commands, files = sandbox.commands, sandbox.files
        assert commands is not None
        assert files is not None
        assert commands.run("echo warm").stdout == "warm\n"
        pod = sandbox.get_pod_name()
        # Deleted by another process (this handle knows nothing of it), as `kubectl delete sandboxclaim` does.
        status, _ = admin.request(
            "DELETE",
            f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{pool}/sandboxclaims/{sandbox.claim_name}",
        )
        assert status == 200
        for path in (
            f"/apis/agents.x-k8s.io/v1beta1/namespaces/{pool}/sandboxes/{sandbox.sandbox_id}",
            f"/api/v1/namespaces/{pool}/pods/{pod}",
        ):
            wait_for(lambda p=path: admin.request("GET", p)[0] == 404, timeout=60, what=f"{path} deleted")
        calls: dict[str, Callable[[], object]] = {
            "run": lambda: commands.run("echo hi"),
            "stream": lambda: list(commands.stream("echo hi")),
            "write": lambda: files.write("x", b"1"),
            "read": lambda: files.read("x"),
        }
        for name, call in calls.items():
            with pytest.raises(SandboxNotFoundError) as info:
                call()
            err = info.value
            assert isinstance(err, SandboxRequestError), name
            assert isinstance(err, SandboxDeletedError), name
            assert err.status_code == 502, (name, str(err))
            assert err.request_sent, name
            assert "Could not connect to the backend sandbox" in str(err), name
            assert f"the Sandbox {pool}/{sandbox.sandbox_id} no longer exists" in str(err), name
