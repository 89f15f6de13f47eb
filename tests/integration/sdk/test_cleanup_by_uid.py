"""Exit cleanup deletes the auto-named claims this client created by UID, on the real control plane +
controller (no router or runtime needed: only the Kubernetes API is used).

A claim name is not an identity: an auto-named claim can be deleted behind the client's back and another
program can create its own claim under that name. Until December 6 cleanup deleted such a claim by name -
whether the program had got it with `get_sandbox()` (the new handle was taken for the one this client
created) or not (the closed handle's DELETE went by name). Now cleanup's DELETE carries the UID of the claim
it created, and the API server's refusal (409, precondition failed) leaves the other program's claim alone.
"""

from __future__ import annotations

import logging
import time

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig

from .conftest import EXT, apply_pool

pytestmark = pytest.mark.integration

# Nothing listens here: these tests never reach a sandbox, only the Kubernetes API.
UNUSED_ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")


def _gone(client: SandboxClient, namespace: str, name: str) -> None:
    deadline = time.monotonic() + 60
    while name in client.list_all_sandboxes(namespace):
        assert time.monotonic() < deadline, f"claim {name} was not deleted"
        time.sleep(0.2)


def _uid(cluster: DevCluster, namespace: str, name: str) -> str:
    status, out = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims/{name}")
    assert status == 200, out
    return str(out["metadata"]["uid"])


def test_cleanup_leaves_a_same_name_claim_of_another_program_alone(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apply_pool(cluster, namespace)
    mine = SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig)
    other = SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig)
    try:
        got = mine.create_sandbox("pool", namespace, sandbox_ready_timeout=90).claim_name
        stale = mine.create_sandbox("pool", namespace, sandbox_ready_timeout=90).claim_name
        assert got is not None
        assert stale is not None
        mine.close()
        # Another program deletes both claims and creates its own under the same names (new UIDs).
        theirs: dict[str, object] = {}
        for name in (got, stale):
            assert other.delete_claim(name, namespace)
            _gone(other, namespace, name)
            theirs[name] = other.create_sandbox("pool", namespace, sandbox_ready_timeout=90, claim_name=name)
        uids = {name: _uid(cluster, namespace, name) for name in theirs}
        # This program gets one of them again: a handle on someone else's claim, not one it created.
        again = mine.get_sandbox(got, namespace)
        assert not again._state.auto_named
        with caplog.at_level(logging.WARNING, logger="agent_sandbox_sdk"):
            mine.__exit__(None, None, None)  # the end of its `with` block: cleanup
        assert sorted(other.list_all_sandboxes(namespace)) == sorted([got, stale])
        assert {name: _uid(cluster, namespace, name) for name in theirs} == uids
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    finally:
        other.__exit__(None, None, None)
