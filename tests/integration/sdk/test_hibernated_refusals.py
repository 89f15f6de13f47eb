"""The Python SDK and a hibernated Sandbox that will never be restored, on the real API server and a real
lifecycle router (`--sandbox-lifecycle`).

- A file call (GET/HEAD/PUT/DELETE, retried on a 503 as upstream) raises the router's 503 "could not be resumed:
  <why>" as it is, at once: until December 6 it read the Sandbox and its archive, was retried for 15.5 s, and
  then added "restore it with the handle's resume()" to the router's word that it never would be.
- `resume()` refuses before it writes: until December 6 it wrote the archive's `spec.restore` (`kubectl get
  sbarchive`: RESTORE Manual) and then said the Sandbox would not be restored.

No controller runs in this module (CRDs installed): it would end the hand-made claims (the claim controller
deletes an expired claim's Sandbox, the lifecycle controller an expired claim's archive) that stand for a
claim whose Sandbox was hibernated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.devcluster.lifecycle import install_lifecycle
from agent_sandbox.kube import SANDBOX_CLAIM, ApiClient, Object
from agent_sandbox_sdk import (
    SandboxClaimFailedError,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxRequestError,
)
from tests.helpers import eventually

from .conftest import EXT, router_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PAST = format_time(datetime.now(UTC) - timedelta(hours=1))
LATER = format_time(datetime.now(UTC) + timedelta(days=365))


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> None:
    """No controller (see the module docstring): the CRDs, the SandboxArchive's included, only."""
    install_crds(cluster)
    install_lifecycle(cluster)


@pytest.fixture(scope="module")
def lifecycle_router(cluster: DevCluster, controller: None) -> Iterator[str]:
    """A router with `--sandbox-lifecycle` (and its Pod cache); its URL."""
    port = cluster.reserve_port("refusals_router_http")
    with router_process(cluster, "refusals_router", f"127.0.0.1:{port}", "--sandbox-lifecycle"):
        yield f"http://127.0.0.1:{port}"


async def hibernated(
    kube: ApiClient,
    namespace: str,
    claim: str,
    sandbox: str,
    *,
    own_deadline: str,
    claim_deadline: str | None,
) -> None:
    """Claim `claim` whose Sandbox `sandbox` is hibernated (auto-resume): as the claim and lifecycle
    controllers leave them, the claim bound to the name and marked, only the SandboxArchive left."""
    spec: dict[str, Any] = {"warmPoolRef": {"name": "no-pool"}}
    if claim_deadline is not None:
        spec["lifecycle"] = {"shutdownTime": claim_deadline, "shutdownPolicy": "Retain"}
    body = {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "metadata": {"name": claim, "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: sandbox}},
        "spec": spec,
    }
    created = await kube.create(SANDBOX_CLAIM, body, namespace=namespace)
    await kube.patch(
        SANDBOX_CLAIM,
        claim,
        {"status": {"sandbox": {"name": sandbox}}},
        namespace=namespace,
        subresource="status",
    )
    owner = {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "name": claim,
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    kept = {
        "metadata": {"annotations": {lc.ANNOTATION_AUTO_RESUME: "true"}},
        "spec": {"shutdownTime": own_deadline, "shutdownPolicy": "Retain"},
    }
    archive: Object = {
        "apiVersion": lc.ARCHIVE.api_version,
        "kind": lc.ARCHIVE.kind,
        "metadata": {"name": sandbox, "ownerReferences": [owner]},
        "spec": {
            "sandbox": kept,
            "sandboxUID": f"old-{sandbox}",
            "archivedAt": format_time(datetime.now(UTC)),
            "reason": str(lc.Cause.REQUESTED),
            "children": [],
        },
    }
    await kube.create(lc.ARCHIVE, archive, namespace=namespace)


async def router_refusal(router: str, namespace: str, sandbox: str) -> str:
    """The router's 503 detail, once its caches know the archive (before, it does not hold the request)."""

    async def probe() -> str | None:
        headers = {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": namespace}
        async with aiohttp.ClientSession() as http, http.get(f"{router}/list/", headers=headers) as resp:
            body = await resp.json(content_type=None) if resp.status == 503 else None
        detail = str(body.get("detail", "")) if isinstance(body, dict) else ""
        return detail if "could not be resumed" in detail else None

    return await eventually(probe, f"the router's refusal of {namespace}/{sandbox}", within=30)


async def never_restored(kube: ApiClient, namespace: str, router: str, expired: str) -> str:
    """Claim `c` of hibernated Sandbox `sb` that will never be restored: its own shutdownTime passed, or its
    claim's; the router's refusal."""
    claim_deadline = PAST if expired == "claim" else None
    own = PAST if expired == "own-shutdown-time" else LATER
    await hibernated(kube, namespace, "c", "sb", own_deadline=own, claim_deadline=claim_deadline)
    refusal = await router_refusal(router, namespace, "sb")
    assert refusal.startswith(f"Sandbox {namespace}/sb could not be resumed: it is hibernated and "), refusal
    return refusal


def client(cluster: DevCluster, router: str) -> SandboxClient:
    return SandboxClient(SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig)


@pytest.mark.parametrize("expired", ["own-shutdown-time", "claim"])
async def test_file_calls_raise_the_routers_refusal_as_it_is(
    kube: ApiClient, namespace: str, cluster: DevCluster, lifecycle_router: str, expired: str
) -> None:
    refusal = await never_restored(kube, namespace, lifecycle_router, expired)

    def use() -> dict[str, tuple[float, str]]:
        with client(cluster, lifecycle_router) as c:
            files = c.get_sandbox("c", namespace).files
            assert files is not None
            said: dict[str, tuple[float, str]] = {}
            for op, call in (
                ("read", lambda: files.read("a.txt")),
                ("exists", lambda: files.exists("a.txt")),
                ("list", lambda: files.list(".")),
                ("delete", lambda: files.delete("a.txt")),
            ):
                start = time.monotonic()
                with pytest.raises(SandboxRequestError) as info:
                    call()
                said[op] = (time.monotonic() - start, str(info.value))
            return said

    for op, (took, text) in (await asyncio.to_thread(use)).items():
        assert text.endswith(f": HTTP 503: {refusal}"), (op, text)  # the router's word, nothing added
        assert took < 5, (op, took)  # not retried (five retries back off 15.5 s)


@pytest.mark.parametrize("expired", ["own-shutdown-time", "claim"])
async def test_resume_refuses_before_it_writes(
    kube: ApiClient, namespace: str, cluster: DevCluster, lifecycle_router: str, expired: str
) -> None:
    await never_restored(kube, namespace, lifecycle_router, expired)

    def resume() -> None:
        with client(cluster, lifecycle_router) as c:
            c.get_sandbox("c", namespace).resume(timeout=30)

    with pytest.raises(SandboxClaimFailedError, match="will not be restored"):
        await asyncio.to_thread(resume)
    archive = await kube.get(lc.ARCHIVE, "sb", namespace=namespace)
    assert "restore" not in archive["spec"], archive["spec"]  # no restore request left behind


async def test_a_hibernated_sandbox_is_listed_suspended_and_its_status_says_hibernated(
    kube: ApiClient, namespace: str, cluster: DevCluster, controller: None
) -> None:
    """Until December 6 `agent-sandbox list` showed it `SUSPENDED false` and `status()` said
    `("SandboxNotFound", "Sandbox object not found in Kubernetes.")`, as of a deleted one (docs/lifecycle.md:
    the CLI and the SDK call it hibernated)."""
    await hibernated(kube, namespace, "c", "sb", own_deadline=LATER, claim_deadline=None)

    def read() -> tuple[bool | None, tuple[str, str]]:
        with SandboxClient(
            SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9"), kubeconfig=cluster.kubeconfig
        ) as c:
            (row,) = c.list_sandboxes(namespace)
            assert c.get_sandbox_info("c", namespace).suspended is True
            return row.suspended, c.get_sandbox("c", namespace).status()

    suspended, (state, message) = await asyncio.to_thread(read)
    assert suspended is True
    assert state == "SandboxNotReady"
    assert message.startswith(f"Sandbox {namespace}/sb is hibernated (archived, volumes kept)"), message
