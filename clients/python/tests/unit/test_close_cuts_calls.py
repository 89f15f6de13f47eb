"""Calls in flight across the client's own `close()` fail with "(client closed)", and are not retried (in-memory
API + runtime, `fakes.py`; against the real control plane: tests/integration/sdk/test_close_in_flight.py).

- A `create_sandbox` waiting for its claim when `close()` ran (the end of a `with` block) reconnected its watch
  after 0.5 s, completed afterwards, and its claim - created after the cleanup - was never deleted (until
  December 7). Now it fails with `SandboxClientClosedError` (a `SandboxConnectionError`) and deletes its claim.
- So does a create whose claim POST was answered while `close()` ran: the handle would be tracked in a registry
  whose cleanup has already run.
- An idempotent call (GET) cut by `close()` was retried after a 0.5 s backoff, which then failed with
  `SandboxNotReadyError` "the connection to sandbox ... was closed" instead of the client-closed error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx2
import pytest

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxConnectionError,
    SandboxDirectConnectionConfig,
)

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)


def _is_watch(request: httpx2.Request) -> bool:
    return request.url.params.get("watch") == "true"


def _is_claim_post(request: httpx2.Request) -> bool:
    return request.method == "POST" and "/sandboxclaims" in request.url.path


def _closing_transport(
    fake: FakeCluster, when: Callable[[httpx2.Request], bool], close: Callable[[], None], *, cut: bool
) -> httpx2.MockTransport:
    """The fake, where the first request matching `when` runs `close()` of the client meanwhile: then fails as a
    closed connection does (`cut`), or is answered."""
    fired: list[bool] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        if not fired and when(request):
            fired.append(True)
            close()
            if cut:
                fake.requests.append(request)
                raise httpx2.ReadError("connection closed", request=request)
        return fake.handle(request)

    return httpx2.MockTransport(handle)


def _async_closing_transport(
    fake: FakeCluster, when: Callable[[httpx2.Request], bool], client: list[AsyncSandboxClient], *, cut: bool
) -> httpx2.MockTransport:
    fired: list[bool] = []

    async def handle(request: httpx2.Request) -> httpx2.Response:
        if not fired and when(request):
            fired.append(True)
            await client[0].close()
            if cut:
                fake.requests.append(request)
                raise httpx2.ReadError("connection closed", request=request)
        return fake.handle(request)

    return httpx2.MockTransport(handle)


@pytest.mark.parametrize(("when", "cut"), [(_is_watch, True), (_is_claim_post, False)], ids=["watch", "post"])
def test_a_sync_create_across_close_fails_and_deletes_its_claim(
    when: Callable[[httpx2.Request], bool], cut: bool
) -> None:
    fake = FakeCluster()
    holder: list[SandboxClient] = []
    transport = _closing_transport(fake, when, lambda: holder[0].close(), cut=cut)
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=transport, cleanup=False)
    holder.append(client)
    with pytest.raises(SandboxConnectionError, match=r"\(client closed\)"):
        client.create_sandbox("python-pool")
    assert fake.claims == {}, "the claim of the create cut by close() was left behind"
    assert client.list_active_sandboxes() == []
    assert [r for r in fake.requests if r.method == "DELETE"], "no rollback DELETE"


@pytest.mark.parametrize(("when", "cut"), [(_is_watch, True), (_is_claim_post, False)], ids=["watch", "post"])
def test_an_async_create_across_close_fails_and_deletes_its_claim(
    when: Callable[[httpx2.Request], bool], cut: bool
) -> None:
    fake = FakeCluster()
    holder: list[AsyncSandboxClient] = []

    async def main() -> list[tuple[str, str]]:
        transport = _async_closing_transport(fake, when, holder, cut=cut)
        client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=transport, cleanup=False)
        holder.append(client)
        with pytest.raises(SandboxConnectionError, match=r"\(client closed\)"):
            await client.create_sandbox("python-pool")
        return await client.list_active_sandboxes()

    assert asyncio.run(main()) == []
    assert fake.claims == {}, "the claim of the create cut by close() was left behind"


def test_a_get_cut_by_close_is_not_sent_again() -> None:
    fake = FakeCluster()
    fake.files["a.txt"] = b"data"
    holder: list[SandboxClient] = []

    def is_download(request: httpx2.Request) -> bool:
        return request.url.path.startswith("/download/")

    transport = _closing_transport(fake, is_download, lambda: holder[0].close(), cut=True)
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=transport, cleanup=False)
    holder.append(client)
    sandbox = client.create_sandbox("python-pool")
    with pytest.raises(SandboxConnectionError, match=r"\(client closed\)"):
        sandbox.files.read("a.txt")
    assert len(fake.find(is_download)) == 1, "the GET cut by close() was sent again"


def test_a_delete_cut_by_the_clients_own_close_is_sent_again() -> None:
    """The rollback DELETE of a create that a `close()` made fail runs into that same close (counted before the
    connections are shut): it is sent again, idempotent by UID, rather than report the claim left behind."""
    from agent_sandbox_sdk import SandboxClientClosedError, _kube
    from agent_sandbox_sdk._closewatch import closed_error
    from agent_sandbox_sdk._steps import HttpResponse

    flow = _kube.delete(_kube.CLAIMS, "ns", "c", uid="u1")
    first = next(flow)
    again = flow.throw(closed_error("DELETE /c"))
    assert again.request.method == "DELETE"
    assert again.request.url == first.request.url
    assert again.request.json == first.request.json  # the UID precondition kept
    again = flow.throw(closed_error("DELETE /c"))
    with pytest.raises(StopIteration) as done:
        flow.send(HttpResponse(200, {}, b"{}", "DELETE", again.request.url))
    assert done.value.value is True
    # Not for ever: a client closed again and again gives up after the resends.
    flow = _kube.delete(_kube.CLAIMS, "ns", "c", uid="u1")
    next(flow)
    for _ in range(2):
        flow.throw(closed_error("DELETE /c"))
    with pytest.raises(SandboxClientClosedError):
        flow.throw(closed_error("DELETE /c"))
