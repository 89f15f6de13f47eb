"""What counts as use for the idle auto-suspend, through the real router (`--sandbox-lifecycle`).

docs/lifecycle.md "Idle auto-suspend": a request is in use from its start until its response head (a slow
call), and after the head only while its bytes move (a long download). A response held open in silence (an
EventSource, a long-poll), an idle gRPC channel, a WebSocket that only heartbeats: not use, the Sandbox idles.
The same rule for HTTP/1.1, each stream of an h2c connection, and WebSockets (data frames only).

Each test serves the app from the host on the Sandbox's pod address (as the sandbox's own server would be,
invisible to the runtime's activity report), so only the router's records keep the Sandbox up, and the app
outlives the suspend (the client sees the Sandbox's mode change, not a dead connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import WSMsgType, web

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube import SANDBOX, ApiClient
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import ready_ip
from tests.integration.lifecycle.test_resume import AUTO, StartRouter, runtime_sandbox

pytestmark = pytest.mark.integration

IDLE = {**AUTO, lc.ANNOTATION_IDLE_TIMEOUT: "3s"}
IN_USE_FOR = 10.0
"""How long each exchange stays in use: over three idle timeouts (the WebSocket test's margin)."""


async def mode(kube: ApiClient, namespace: str, name: str) -> str:
    return str((await kube.get(SANDBOX, name, namespace=namespace))["spec"].get("operatingMode"))


async def running_throughout(kube: ApiClient, namespace: str, name: str, call: Awaitable[Any]) -> Any:
    """`call`'s result, failing the test if the Sandbox leaves Running before it is done."""
    task = asyncio.ensure_future(call)
    try:
        while not task.done():
            assert await mode(kube, namespace, name) == "Running", "suspended under an exchange in use"
            await asyncio.wait([task], timeout=0.5)
        return task.result()
    finally:
        task.cancel()


async def idles(kube: ApiClient, namespace: str, name: str) -> None:
    async def suspended() -> bool:
        return await mode(kube, namespace, name) == "Suspended"

    await eventually(suspended, f"{name} suspended, its connection still open", within=30)


@asynccontextmanager
async def serving(app: web.Application, ip: str) -> AsyncIterator[int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, ip, 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def headers(name: str, namespace: str, port: int) -> dict[str, str]:
    return {"X-Sandbox-ID": name, "X-Sandbox-Namespace": namespace, "X-Sandbox-Port": str(port)}


async def test_a_slow_grpc_call_keeps_its_sandbox_up_and_an_idle_channel_does_not(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    """A unary call that runs 10 s sends nothing until its answer: in use (it used to count only bytes, and
    the Sandbox was suspended under the call, UNAVAILABLE for a server in the pod). The channel left open
    after it is not."""
    router = await start_router("--enable-h2c", "--sandbox-lifecycle-activity-interval=1s")
    await kube.create(SANDBOX, runtime_sandbox("grpc-slow", IDLE), namespace=namespace)
    ip = await ready_ip(kube, namespace, "grpc-slow")

    async def slow(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await asyncio.sleep(IN_USE_FOR)
        return b"done " + request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "t.Slow", {"Call": grpc.unary_unary_rpc_method_handler(slow)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{ip}:0")
    await server.start()
    metadata = tuple((k.lower(), v) for k, v in headers("grpc-slow", namespace, port).items())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
            call = channel.unary_unary("/t.Slow/Call")(b"call", metadata=metadata, timeout=60)
            assert await running_throughout(kube, namespace, "grpc-slow", call) == b"done call"
            await idles(kube, namespace, "grpc-slow")
    finally:
        await server.stop(None)


async def test_a_streaming_grpc_call_silent_between_its_messages_keeps_its_sandbox_up(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    """A server-streaming call that answers its head with a first message, then stays silent for 10 s before
    the last one (sandboxd's `Start` stream of a command that prints nothing for a while): in use until it
    ends, the head sent or not - a gRPC call is a command still running, not a tab left open (the rule of
    4e1b5cf counted it only while bytes moved, and the Sandbox was suspended under it)."""
    router = await start_router("--enable-h2c", "--sandbox-lifecycle-activity-interval=1s")
    await kube.create(SANDBOX, runtime_sandbox("grpc-stream", IDLE), namespace=namespace)
    ip = await ready_ip(kube, namespace, "grpc-stream")

    async def events(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> AsyncIterator[bytes]:
        yield b"started"
        await asyncio.sleep(IN_USE_FOR)
        yield b"exited"

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "t.Process", {"Start": grpc.unary_stream_rpc_method_handler(events)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{ip}:0")
    await server.start()
    metadata = tuple((k.lower(), v) for k, v in headers("grpc-stream", namespace, port).items())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:

            async def read_all() -> list[bytes]:
                call = channel.unary_stream("/t.Process/Start")(b"go", metadata=metadata, timeout=60)
                return [message async for message in call]

            assert await running_throughout(kube, namespace, "grpc-stream", read_all()) == [
                b"started",
                b"exited",
            ]
            await idles(kube, namespace, "grpc-stream")
    finally:
        await server.stop(None)


async def test_websocket_heartbeats_do_not_keep_its_sandbox_up(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    """A tab left open on an app that pings every second (aiohttp's `heartbeat`; the client pongs): the
    Sandbox idles as for a silent connection (pings and pongs used to count, and it never idled), while the
    connection itself stays open (`--websocket-idle-timeout` still counts them)."""
    router = await start_router("--sandbox-lifecycle-activity-interval=1s")
    await kube.create(SANDBOX, runtime_sandbox("ws-beat", IDLE), namespace=namespace)
    ip = await ready_ip(kube, namespace, "ws-beat")

    async def beat(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=1.0)
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    app = web.Application()
    app.router.add_get("/ws", beat)
    async with (
        serving(app, ip) as port,
        aiohttp.ClientSession() as session,
        session.ws_connect(
            f"http://127.0.0.1:{router.http_port}/ws", headers=headers("ws-beat", namespace, port)
        ) as ws,
    ):

        async def pinged() -> None:
            msg = await ws.receive()  # the client pongs by itself; nothing else arrives
            pytest.fail(f"unexpected {msg}")

        listener = asyncio.ensure_future(pinged())
        try:
            await idles(kube, namespace, "ws-beat")
        finally:
            listener.cancel()
        assert not ws.closed  # the heartbeats kept the connection itself open


async def test_a_websocket_data_message_either_way_is_use(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    """Data frames are use whichever way they go: a client that only sends (input typed in a terminal) keeps
    the Sandbox up as one that only receives."""
    router = await start_router("--sandbox-lifecycle-activity-interval=1s")
    await kube.create(SANDBOX, runtime_sandbox("ws-typing", IDLE), namespace=namespace)
    ip = await ready_ip(kube, namespace, "ws-typing")

    async def sink(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            assert msg.type == WSMsgType.TEXT
        return ws

    app = web.Application()
    app.router.add_get("/ws", sink)
    async with (
        serving(app, ip) as port,
        aiohttp.ClientSession() as session,
        session.ws_connect(
            f"http://127.0.0.1:{router.http_port}/ws", headers=headers("ws-typing", namespace, port)
        ) as ws,
    ):

        async def typing() -> None:
            for i in range(int(IN_USE_FOR)):
                await ws.send_str(f"key {i}")
                await asyncio.sleep(1)

        await running_throughout(kube, namespace, "ws-typing", typing())
        await idles(kube, namespace, "ws-typing")


async def test_a_slow_call_and_a_download_keep_their_sandbox_up_a_silent_event_stream_does_not(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    """HTTP/1.1 by the same rule: a call with no response head for 10 s is in use, a download that moves a
    chunk a second is in use, an EventSource that got its head and first event and then waits is not (the
    whole response used to count, and a tab left open kept its Sandbox up for as long as it stayed open)."""
    router = await start_router("--sandbox-lifecycle-activity-interval=1s")
    await kube.create(SANDBOX, runtime_sandbox("http-use", IDLE), namespace=namespace)
    ip = await ready_ip(kube, namespace, "http-use")
    silent = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(IN_USE_FOR)
        return web.Response(text="done")

    async def download(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(int(IN_USE_FOR)):
            await response.write(b"x" * 1024)
            await asyncio.sleep(1)
        await response.write_eof()
        return response

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: hello\n\n")
        await silent.wait()  # never set: a stream with nothing more to say
        return response

    app = web.Application()
    app.router.add_get("/slow", slow)
    app.router.add_get("/download", download)
    app.router.add_get("/events", events)
    base = f"http://127.0.0.1:{router.http_port}"
    timeout = aiohttp.ClientTimeout(total=120)
    async with serving(app, ip) as port, aiohttp.ClientSession(timeout=timeout) as session:
        routed = headers("http-use", namespace, port)

        async def get(path: str) -> bytes:
            async with session.get(base + path, headers=routed) as response:
                assert response.status == 200
                return await response.read()

        assert await running_throughout(kube, namespace, "http-use", get("/slow")) == b"done"
        assert len(await running_throughout(kube, namespace, "http-use", get("/download"))) == 10 * 1024
        async with session.get(base + "/events", headers=routed) as stream:
            assert await stream.content.readuntil(b"\n\n") == b"data: hello\n\n"
            await idles(kube, namespace, "http-use")
