"""An interruption during a claim's DELETE - a cancelled task, Ctrl-C - does not leave the claim behind: the
DELETE is completed (async: shielded; sync: sent again), the other claims of a client's cleanup are deleted
too, and then the interruption is raised. Real control plane and controller; only the Kubernetes API is used.

The interruption is timed by the test, not by sleeps: a hook in the driver holds the first claim DELETE
before it is sent (async) until the test has cancelled the task, or raises `KeyboardInterrupt` in its place
(sync, what a Ctrl-C there raises). The DELETEs themselves are real.

Until December 7: the client's cleanup dropped each handle from its registry before its DELETE, so the
claim whose DELETE was cut outlived the process - even the exit hook of `cleanup=True` no longer knew it -
and the cleanup stopped there, leaving the others to that hook; a cancelled `async with sandbox:` exit left
its claim with the handle closed and `claim_name` still set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxDirectConnectionConfig
from agent_sandbox_sdk._driver import AsyncDriver, SyncDriver
from agent_sandbox_sdk._steps import HttpRequest
from tests.helpers import wait_for

from .conftest import EXT, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Nothing listens here: these tests never reach a sandbox, only the Kubernetes API.
UNUSED_ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=3)
    return namespace


def _claims(cluster: DevCluster, namespace: str) -> list[str]:
    status, out = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
    assert status == 200, out
    return sorted(item["metadata"]["name"] for item in out["items"])


def _claim_delete(request: HttpRequest) -> bool:
    return request.method == "DELETE" and "/sandboxclaims/" in request.url


class HeldDelete:
    """Holds the first claim DELETE the async driver is about to send until `release()`; `held` is set then."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held = asyncio.Event()
        self._gate = asyncio.Event()
        self._armed = True
        original: Callable[..., Any] = AsyncDriver._http

        async def hold(driver: AsyncDriver, request: HttpRequest, **kw: Any) -> Any:
            if self._armed and _claim_delete(request):
                self._armed = False
                self.held.set()
                await self._gate.wait()  # a cancellation of the DELETE lands here, before it is sent
            return await original(driver, request, **kw)

        monkeypatch.setattr(AsyncDriver, "_http", hold)

    def release(self) -> None:
        self._gate.set()


def _interrupt_first_delete(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Ctrl-C in place of the first claim DELETE the sync driver sends; returns the URLs of the DELETEs sent."""
    original: Callable[..., Any] = SyncDriver._http
    sent: list[str] = []
    armed = [True]

    def interrupt(driver: SyncDriver, request: HttpRequest, **kw: Any) -> Any:
        if _claim_delete(request):
            if armed.pop() if armed else False:
                raise KeyboardInterrupt  # before it is sent
            sent.append(request.url)
        return original(driver, request, **kw)

    monkeypatch.setattr(SyncDriver, "_http", interrupt)
    return sent


def test_a_cancelled_async_client_exit_deletes_every_claim(
    cluster: DevCluster, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task is cancelled while the exit's first DELETE is in flight; the exit still deletes all three
    claims, then the task ends cancelled. What the exit hook of `cleanup=True` would delete afterwards
    (`_cleanup_at_exit`, run here by hand) is nothing."""
    client = AsyncSandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig, cleanup=False)

    async def main() -> None:
        hold = HeldDelete(monkeypatch)

        async def body() -> None:
            async with client:
                await asyncio.gather(
                    *(client.create_sandbox("pool", pool, sandbox_ready_timeout=90) for _ in range(3))
                )

        task = asyncio.create_task(body())
        await asyncio.wait_for(hold.held.wait(), 150)
        task.cancel()
        await asyncio.sleep(0)  # the cancellation is delivered while the DELETE is held
        hold.release()
        await asyncio.wait([task], timeout=60)
        assert task.cancelled()

    asyncio.run(main())
    client._cleanup_at_exit()  # the exit hook: a claim the cut cleanup forgot would stay for good
    wait_for(lambda: _claims(cluster, pool) == [], timeout=30, what="every claim deleted")
    assert client._registry.handles == {}


def test_a_cancelled_async_with_sandbox_exit_deletes_its_claim(
    cluster: DevCluster, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`async with sandbox:` cancelled during its `terminate()`'s DELETE: the DELETE completes, the handle
    records it (`claim_name` None, no longer tracked), then the cancellation is raised."""

    async def main() -> None:
        client = AsyncSandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig, cleanup=False)
        try:
            sandbox = await client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
            name = sandbox.claim_name
            hold = HeldDelete(monkeypatch)

            async def use() -> None:
                async with sandbox:
                    pass

            task = asyncio.create_task(use())
            await asyncio.wait_for(hold.held.wait(), 60)
            task.cancel()
            await asyncio.sleep(0)
            hold.release()
            await asyncio.wait([task], timeout=60)
            assert task.cancelled()
            assert not sandbox.is_active
            assert sandbox.claim_name is None, f"claim {name} not recorded as deleted"
            assert client._registry.handles == {}
        finally:
            await client.close()  # claims stay through close(): only the DELETE above removes it

    asyncio.run(main())
    wait_for(lambda: _claims(cluster, pool) == [], timeout=30, what="the claim deleted")


def test_ctrl_c_during_the_sync_client_exit_deletes_every_claim(
    cluster: DevCluster, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during the `with SandboxClient(...)` exit's first DELETE: that DELETE is sent again, the other
    claims are deleted too, then the `KeyboardInterrupt` is raised."""
    client = SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig)
    names = [client.create_sandbox("pool", pool, sandbox_ready_timeout=90).claim_name for _ in range(3)]
    sent = _interrupt_first_delete(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        client.__exit__(None, None, None)  # the end of its `with` block
    assert len(sent) == 3, sent  # the interrupted one again, and the two others
    assert all(name is not None for name in names)
    assert client._registry.handles == {}
    wait_for(lambda: _claims(cluster, pool) == [], timeout=30, what="every claim deleted")


def test_ctrl_c_during_a_sync_with_sandbox_exit_deletes_its_claim(
    cluster: DevCluster, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig)
    try:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        sent = _interrupt_first_delete(monkeypatch)
        with pytest.raises(KeyboardInterrupt), sandbox:
            pass
        assert len(sent) == 1
        assert sandbox.claim_name is None
        assert client._registry.handles == {}
    finally:
        client.close()
    wait_for(lambda: _claims(cluster, pool) == [], timeout=30, what="the claim deleted")
