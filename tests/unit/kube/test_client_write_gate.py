"""The API client's write gate against a real HTTP server on loopback: when is a write refused?

The deposed-leader case the manager's gate exists for: a write passes the gate, then waits for a pooled
connection while the process is frozen past its lease; when it runs again it must not go out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agent_sandbox.kube import ApiClient, NotLeader
from agent_sandbox.kube import _rest as rest_module
from agent_sandbox.kube._config import ClusterConfig, NoAuth
from agent_sandbox.kube._resources import CONFIG_MAP


class Server:
    """Records every request it receives; GET /hold/... blocks until `release` is set."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path))
        if request.path.startswith("/hold"):
            self.holding.set()
            await self.release.wait()
        body = await request.read()
        return web.Response(body=body or b"{}", content_type="application/json")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", srv.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    srv.url = f"http://127.0.0.1:{port}"
    yield srv
    srv.release.set()
    await runner.cleanup()


class Leadership:
    def __init__(self) -> None:
        self.current = True
        self.asked = 0
        self.was_asked = asyncio.Event()

    def gate(self) -> None:
        self.asked += 1
        self.was_asked.set()
        if not self.current:
            raise NotLeader("refusing to write: not leading")


def new_client(server: Server, leadership: Leadership) -> ApiClient:
    api = ApiClient(ClusterConfig(server=server.url, ssl=None, auth=NoAuth()))
    api.set_write_gate(leadership.gate)
    return api


CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}


async def test_a_write_that_waited_for_a_connection_is_refused_if_leadership_lapsed_meanwhile(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rest_module, "_CONNS_PER_SHARD", 1)  # one socket: the write must queue for it
    leadership = Leadership()
    async with new_client(server, leadership) as api:
        held = asyncio.create_task(api.request("GET", "/hold/it"))
        await asyncio.wait_for(server.holding.wait(), 5)
        write = asyncio.create_task(api.create(CONFIG_MAP, CM))
        await asyncio.wait_for(leadership.was_asked.wait(), 5)  # passed the first check; waits for the socket
        leadership.current = False  # the process "froze" past its lease while the write waited
        server.release.set()
        await asyncio.wait_for(held, 5)
        with pytest.raises(NotLeader):
            await asyncio.wait_for(write, 5)
        assert leadership.asked == 2
        assert [m for m, _ in server.seen] == ["GET"]  # the refused write never reached the server
        # The socket went back to the pool: reads (never gated) still flow through it.
        await asyncio.wait_for(api.request("GET", "/after"), 5)
        assert server.seen[-1] == ("GET", "/after")


async def test_writes_go_out_while_leading_and_reads_are_never_gated(server: Server) -> None:
    leadership = Leadership()
    async with new_client(server, leadership) as api:
        await api.create(CONFIG_MAP, CM)
        # before taking a connection, once it is in hand, and at the socket write (head and body in one)
        assert leadership.asked == 3
        leadership.current = False
        with pytest.raises(NotLeader):
            await api.create(CONFIG_MAP, CM)
        assert leadership.asked == 4  # refused before any connection was taken
        await api.request("GET", "/read")
    assert [m for m, _ in server.seen] == ["POST", "GET"]


async def test_a_write_is_refused_at_the_socket_if_leadership_lapsed_after_the_connection_was_taken(
    server: Server,
) -> None:
    """The span the connection check leaves: the request is serialised after it (a freeze there sent a
    deposed leader's write in CI). The socket write asks again; a refusal sends nothing, the connection
    is dropped, and later reads open a new one."""
    leadership = Leadership()
    async with new_client(server, leadership) as api:
        await api.request("GET", "/warm")  # a pooled connection, so the write takes it without waiting

        def lapse_after_the_connection_check() -> None:
            leadership.gate()
            if leadership.asked == 2:  # the check once the connection is in hand passed...
                leadership.current = False  # ...then the process "froze" past its lease

        api.set_write_gate(lapse_after_the_connection_check)
        with pytest.raises(NotLeader):
            await api.create(CONFIG_MAP, CM)
        assert leadership.asked == 3
        assert [m for m, _ in server.seen] == ["GET"]  # nothing of the write reached the server
        await asyncio.wait_for(api.request("GET", "/after"), 5)
        assert server.seen[-1] == ("GET", "/after")
