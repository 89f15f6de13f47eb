"""A create whose handle cannot be made (a `sandbox_class` whose constructor raises) deletes the Ready
auto-named claim it created (in-memory API + runtime, `fakes.py`).

The handle is made by the driver's `keep` callback once the claim is Ready; when that raised, the claim was
in no registry - neither the end of `async with` nor the exit cleanup deleted it, and the Sandbox it held
ran on. An explicitly named claim stays, as on any failed create: the name is the caller's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sandbox_sdk import (
    AsyncSandbox,
    AsyncSandboxClient,
    Sandbox,
    SandboxClient,
    SandboxDirectConnectionConfig,
)

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit


class _Refused(Exception):
    pass


class _RefusingSandbox(AsyncSandbox):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _Refused("this handle cannot be made")


class _Client(AsyncSandboxClient):
    sandbox_class = _RefusingSandbox


@pytest.mark.parametrize("claim_name", [None, "mine"])
def test_a_claim_whose_handle_raises_is_deleted_when_auto_named(claim_name: str | None) -> None:
    fake = FakeCluster()

    async def main() -> list[tuple[str, str]]:
        config = SandboxDirectConnectionConfig(api_url=ROUTER)
        async with _Client(
            config, api_client=endpoint(), transport=fake.transport(), cleanup=False
        ) as client:
            with pytest.raises(_Refused):
                await client.create_sandbox("python-pool", claim_name=claim_name)
            return await client.list_active_sandboxes()

    assert asyncio.run(main()) == []
    posted = [r for r in fake.requests if r.method == "POST" and r.url.path.endswith("/sandboxclaims")]
    assert len(posted) == 1  # the claim was created ...
    if claim_name is None:
        assert fake.claims == {}  # ... and deleted
    else:
        assert list(fake.claims) == ["mine"]


class _RefusingSyncSandbox(Sandbox):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _Refused("this handle cannot be made")


class _SyncClient(SandboxClient):
    sandbox_class = _RefusingSyncSandbox


@pytest.mark.parametrize("claim_name", [None, "mine"])
def test_the_sync_client_deletes_it_too(claim_name: str | None) -> None:
    fake = FakeCluster()
    config = SandboxDirectConnectionConfig(api_url=ROUTER)
    with _SyncClient(config, api_client=endpoint(), transport=fake.transport(), cleanup=False) as client:
        with pytest.raises(_Refused):
            client.create_sandbox("python-pool", claim_name=claim_name)
        assert client.list_active_sandboxes() == []
    if claim_name is None:
        assert fake.claims == {}
    else:
        assert list(fake.claims) == ["mine"]
