"""A handle whose `terminate()` deleted its claim is no longer tracked by its client.

Until December 7 every terminated handle stayed in the client's registry until `list_active_sandboxes()` was
called (~750 B each: a long-lived client creating and terminating sandboxes grew without bound, and its exit
cleanup walked every dead handle). A handle whose DELETE failed stays tracked: cleanup deletes it later.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxDirectConnectionConfig

from .fakes import ROUTER, FakeCluster, endpoint

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)


def test_sync_terminated_handles_are_forgotten() -> None:
    fake = FakeCluster()
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())
    try:
        for _ in range(5):
            with client.create_sandbox("python-pool"):
                pass
        kept = client.create_sandbox("python-pool")
        deleted = client.create_sandbox("python-pool")
        assert deleted.claim_name is not None
        client.delete_sandbox(deleted.claim_name)
        assert list(client._registry.handles) == [("default", kept.claim_name)]
        assert list(client._registry._pids) == [("default", kept.claim_name)]
        assert client.list_active_sandboxes() == [("default", kept.claim_name)]
        kept.terminate()
        assert client._registry.handles == {}
        assert fake.claims == {}
    finally:
        client.close()


def test_async_terminated_handles_are_forgotten() -> None:
    async def main() -> None:
        fake = FakeCluster()
        client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)
        try:

            async def one() -> None:
                async with await client.create_sandbox("python-pool"):
                    pass

            await asyncio.gather(*(one() for _ in range(5)))
            kept = await client.create_sandbox("python-pool")
            deleted = await client.create_sandbox("python-pool")
            assert deleted.claim_name is not None
            await client.delete_sandbox(deleted.claim_name)
            assert list(client._registry.handles) == [("default", kept.claim_name)]
            assert await client.list_active_sandboxes() == [("default", kept.claim_name)]
            await kept.terminate()
            assert client._registry.handles == {}
            assert fake.claims == {}
        finally:
            await client.close()

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_handle_whose_delete_failed_stays_tracked_and_a_newer_handle_is_kept(mode: str) -> None:
    """A failed DELETE leaves the handle to cleanup (`list_active_sandboxes` leaves a closed auto-named
    handle too); a terminated handle replaced by a newer one on its claim (`get_sandbox` after `close()`)
    does not drop the newer one."""
    fake = FakeCluster()
    if mode == "sync":
        sync = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())

        def run(call: Any) -> Any:
            return call(sync)

    else:
        loop = asyncio.new_event_loop()
        aio = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)

        def run(call: Any) -> Any:
            result = call(aio)
            return loop.run_until_complete(result) if asyncio.iscoroutine(result) else result

    try:
        sandbox = run(lambda c: c.create_sandbox("python-pool"))
        name = sandbox.claim_name
        fake.faults[f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims/{name}"] = [
            403
        ]
        run(lambda c: c.delete_sandbox(name))  # logged, not raised
        assert name in fake.claims
        registry = sync._registry if mode == "sync" else aio._registry
        assert list(registry.handles) == [("default", name)]
        run(lambda c: c.list_active_sandboxes())
        assert list(registry.handles) == [("default", name)]  # cleanup still has to delete it
        newer = run(lambda c: c.get_sandbox(name))
        assert newer is not sandbox
        assert registry.handles[("default", name)] is newer
        run(lambda _c: sandbox.terminate())  # deletes the claim (same UID); the newer handle stays tracked
        assert name not in fake.claims
        assert registry.handles[("default", name)] is newer
        run(lambda _c: newer.terminate())
        assert registry.handles == {}
    finally:
        if mode == "sync":
            sync.close()
        else:
            loop.run_until_complete(aio.close())
            loop.close()


def test_a_claim_whose_delete_failed_in_the_async_exit_is_left_to_the_exit_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The `async with` exit's DELETE refused (403): the handle stays tracked, and the interpreter-exit hook
    (`cleanup=True`) deletes the claim. Until December 7 the exit dropped it first, and nothing deleted it."""
    from agent_sandbox_sdk import async_sandbox_client
    from agent_sandbox_sdk._driver import SyncDriver

    fake = FakeCluster()
    monkeypatch.setattr(
        async_sandbox_client, "SyncDriver", lambda kube: SyncDriver(kube, transport=fake.transport())
    )
    client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)

    async def main() -> str:
        async with client:
            sandbox = await client.create_sandbox("python-pool")
            assert sandbox.claim_name is not None
            path = f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims/{sandbox.claim_name}"
            fake.faults[path] = [403]
        return sandbox.claim_name

    name = asyncio.run(main())
    assert name in fake.claims
    assert list(client._registry.handles) == [("default", name)]
    client._cleanup_at_exit()
    assert fake.claims == {}
