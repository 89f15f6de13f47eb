"""An empty (or missing) claim name is refused before anything is sent. Until December 6 the SDK built the
object's path as `<collection>/` + name, so with "" it addressed the collection: `delete_claim("")` and the
CLI's `delete ""` were a deletecollection - every claim of the namespace deleted - and `get_sandbox(None)`
waited 30 s on the list for a claim that could not exist. A name computed from a failed lookup or an unset
variable is an ordinary bug in a caller; it must not cost every sandbox of the team."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agent_sandbox.cli.main import main
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxDirectConnectionConfig
from tests.integration.sdk.conftest import EXT

pytestmark = pytest.mark.integration

ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")
NAMES = ("keep-a", "keep-b")


def _claims(cluster: DevCluster, namespace: str) -> list[str]:
    status, body = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
    assert status == 200, body
    return sorted(item["metadata"]["name"] for item in body["items"])


@pytest.fixture
def claims(cluster: DevCluster, namespace: str, controller: Started) -> None:
    """Two claims (of a pool that does not exist: they stay unbound, which is all this needs; the controller
    installs the CRDs)."""
    for name in NAMES:
        body = {
            "apiVersion": EXT,
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"warmPoolRef": {"name": "pool"}},
        }
        status, out = cluster.admin().request(
            "POST", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims", body
        )
        assert status == 201, out
    assert _claims(cluster, namespace) == list(NAMES)


@pytest.mark.parametrize("name", ["", None])
@pytest.mark.parametrize(
    "call",
    [
        lambda c, name, ns: c.delete_claim(name, ns),
        lambda c, name, ns: c.delete_sandbox(name, ns),
        lambda c, name, ns: c.get_sandbox(name, ns, resolve_timeout=5),
    ],
    ids=["delete_claim", "delete_sandbox", "get_sandbox"],
)
def test_the_sync_client_refuses_an_empty_claim_name(
    cluster: DevCluster,
    namespace: str,
    claims: None,
    call: Callable[[SandboxClient, Any, str], object],
    name: str | None,
) -> None:
    refused = r"sandboxclaim name must be a non-empty string, not (''|None)"
    with (
        SandboxClient(ROUTER, kubeconfig=str(cluster.kubeconfig)) as client,
        pytest.raises(ValueError, match=refused),
    ):
        call(client, name, namespace)
    assert _claims(cluster, namespace) == list(NAMES)


def test_the_async_client_refuses_an_empty_claim_name(
    cluster: DevCluster, namespace: str, claims: None
) -> None:
    async def attempt() -> None:
        async with AsyncSandboxClient(ROUTER, kubeconfig=str(cluster.kubeconfig)) as client:
            for call in (client.delete_claim, client.delete_sandbox):
                with pytest.raises(ValueError, match="sandboxclaim name must be a non-empty string"):
                    await call("", namespace)

    asyncio.run(attempt())
    assert _claims(cluster, namespace) == list(NAMES)


@pytest.mark.parametrize("command", ["delete", "get", "suspend"])
def test_the_cli_refuses_an_empty_claim_name(
    cluster: DevCluster, namespace: str, claims: None, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([command, "", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)])
    _, err = capsys.readouterr()
    assert code != 0
    assert "sandboxclaim name must be a non-empty string" in err
    assert _claims(cluster, namespace) == list(NAMES)
