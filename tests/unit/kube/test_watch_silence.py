"""A watch whose connection goes silent is taken for dead: a real HTTP server on loopback that sends one
event and then nothing, as a connection frozen by a proxy or NAT looks to the client.

With bookmarks the API server's watch cache speaks about once a minute; until December 6 the client waited
for the watch's own timeout plus 30 s (330-630 s), and a router kept routing by a stale Pod cache for 5
minutes. The gap is shortened here so the test takes a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from agent_sandbox.kube import ApiClient, TransportError
from agent_sandbox.kube import _rest as rest_module
from agent_sandbox.kube._config import ClusterConfig, NoAuth
from agent_sandbox.kube._resources import CONFIG_MAP

pytestmark = pytest.mark.unit

EVENT = b'{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","resourceVersion":"5"}}}\n'


@asynccontextmanager
async def watch_server(then_silent: bool) -> AsyncIterator[str]:
    """A loopback HTTP server answering any GET with a watch's 200 and one event, then silence (a connection
    frozen on the way) or the end of the watch; yields its "127.0.0.1:port"."""

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(EVENT)
        if then_silent:
            await asyncio.sleep(60)
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", watch)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    async with watch_server(then_silent=True) as host:
        yield f"http://{host}"


async def test_a_silent_watch_with_bookmarks_is_dead_after_the_bookmark_gap(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rest_module, "WATCH_BOOKMARK_GAP", 1.0)
    api = ApiClient(ClusterConfig(server=silent_server, ssl=None, auth=NoAuth()))
    try:
        events: list[object] = []

        async def consume() -> None:
            async with asyncio.timeout(20):
                async for event in api.watch(
                    CONFIG_MAP, namespace="n", allow_bookmarks=True, timeout_seconds=300
                ):
                    events.append(event)

        started = time.monotonic()
        with pytest.raises(TransportError):
            await consume()
        assert len(events) == 1
        assert time.monotonic() - started < 5
    finally:
        await api.close()
