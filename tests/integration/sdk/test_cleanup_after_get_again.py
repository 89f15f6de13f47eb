"""Exit cleanup (`cleanup=True`) of an auto-named claim whose handle was got again after `close()`, on the real
control plane + controller (no router or runtime needed: `get_sandbox` only resolves the claim).

`close()` disconnects the handles and keeps the claims, which cleanup still deletes at exit; a `get_sandbox`
afterwards makes a new handle on the same claim. Until December 6 that handle (not auto-named) replaced the
closed one in the client's registry, and the claim outlived the process - with `close()` alone, or
`get_sandbox()` alone, the exit deleted it. Sync and async clients, as a program exits (interpreter exit).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig

from .conftest import apply_pool

pytestmark = pytest.mark.integration

# Nothing listens here: these tests never reach a sandbox, only the Kubernetes API.
UNUSED_ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")

_SYNC = """
import sys
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig
client = SandboxClient(
    SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9"), kubeconfig=sys.argv[1], cleanup=True
)
sandbox = client.create_sandbox("pool", sys.argv[2], sandbox_ready_timeout=90)
kept = client.create_sandbox("pool", sys.argv[2], sandbox_ready_timeout=90, claim_name="kept")
client.close()
again = client.get_sandbox(sandbox.claim_name, sys.argv[2])
client.get_sandbox("kept", sys.argv[2])
print(again.is_active and again is not sandbox, sandbox.claim_name, flush=True)
"""

_ASYNC = """
import asyncio, sys
from agent_sandbox_sdk import AsyncSandboxClient, SandboxDirectConnectionConfig
client = AsyncSandboxClient(SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9"), kubeconfig=sys.argv[1])

async def main():
    sandbox = await client.create_sandbox("pool", sys.argv[2], sandbox_ready_timeout=90)
    await client.create_sandbox("pool", sys.argv[2], sandbox_ready_timeout=90, claim_name="kept")
    await client.close()
    again = await client.get_sandbox(sandbox.claim_name, sys.argv[2])
    await client.get_sandbox("kept", sys.argv[2])
    print(again.is_active and again is not sandbox, sandbox.claim_name, flush=True)

asyncio.run(main())  # the claims are left to the client's atexit cleanup (cleanup=True is the default)
"""


@pytest.mark.parametrize("script", [_SYNC, _ASYNC], ids=["sync", "async"])
def test_an_auto_named_claim_got_again_after_close_is_deleted_at_exit(
    cluster: DevCluster, namespace: str, controller: Started, script: str
) -> None:
    apply_pool(cluster, namespace)
    out = subprocess.run(
        [sys.executable, "-c", script, str(cluster.kubeconfig), namespace],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    active, claim = out.stdout.split()
    assert active == "True", (out.stdout, out.stderr)
    assert claim.startswith("sandbox-claim-")
    with SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig) as c:
        # the auto-named claim was deleted by the exit; the explicitly named one is only disconnected
        assert c.list_all_sandboxes(namespace) == ["kept"]
