"""WebSocket pass-through (router spec §1.8) and the limits on upgraded connections."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from agent_sandbox.router import Router
from tests.helpers import eventually

from .conftest import Backend, fresh_ip, raw_backend, raw_request, request_bytes, scrape

pytestmark = pytest.mark.integration


def ws_url(router: Router) -> str:
    return f"ws://127.0.0.1:{router.http_port}/ws"


async def test_echo(router: Router, backend: Backend) -> None:
    headers = backend.headers(Origin="http://evil.example", Authorization="Bearer x")
    async with websockets.connect(ws_url(router), additional_headers=headers, subprotocols=["echo.v1"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "echo.v1"
        await ws.send("hello")
        assert await ws.recv() == "hello"
        await ws.send(b"\x00\x01" * 40000)
        assert await ws.recv() == b"\x00\x01" * 40000
    seen = backend.seen[-1]["ws_headers"]
    assert "Origin" not in seen  # dropped on upgrades, as upstream
    assert "Authorization" not in seen
    assert seen["X-Sandbox-ID"] == "sb"
    metrics_text = await scrape(router)
    assert (
        'sandbox_router_requests_total{code="101",method="GET",sandbox_namespace="default"} 1.0'
        in metrics_text
    )


async def test_idle_timeout_closes_1001(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    router = await start_router("--websocket-idle-timeout=1s")
    async with websockets.connect(ws_url(router), additional_headers=backend.headers()) as ws:
        await ws.send("ping")
        await ws.recv()
        start = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "idle timeout exceeded")
    assert 0.5 < time.monotonic() - start < 4


async def test_lifetime_closes_1001(start_router: Callable[..., Awaitable[Router]], backend: Backend) -> None:
    router = await start_router("--websocket-max-lifetime=1s")
    async with websockets.connect(ws_url(router), additional_headers=backend.headers()) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await _ping_forever(ws)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "max lifetime exceeded")


async def _ping_forever(ws: websockets.ClientConnection) -> None:
    while True:  # busy, so only the lifetime can end the connection
        await ws.send("x")
        await ws.recv()
        await asyncio.sleep(0.1)


async def test_message_too_big_closes_1009(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    router = await start_router("--websocket-max-message-bytes=1024")
    # The limit counts payload bytes on the wire; with permessage-deflate those are compressed bytes.
    async with websockets.connect(
        ws_url(router), additional_headers=backend.headers(), compression=None
    ) as ws:
        await ws.send("big:1000")
        assert len(await ws.recv()) == 1000
        await ws.send("big:5000")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1009, "message too big")


async def test_message_too_big_with_its_header_split_across_reads(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    """A sandbox (untrusted) sends the header of an oversized frame in two pieces, apart in time: the
    first piece must not reach the client ahead of the close frame, or the client reads the close frame
    as the rest of that header (a protocol error instead of 1009). The router holds a split header back."""
    import base64
    import hashlib

    async def sandbox(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + b"\x81\x02hi"
        )
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.write(b"\x82")  # FIN + binary: the first byte of the oversized frame's header
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.write(b"\x7e" + struct.pack("!H", 5000) + b"x" * 5000)
        await writer.drain()
        await reader.read()
        writer.close()

    ip = fresh_ip()
    server = await asyncio.start_server(sandbox, ip, 0)
    port = server.sockets[0].getsockname()[1]
    router = await start_router("--websocket-max-message-bytes=1024")
    headers = {"X-Sandbox-ID": "sb", "X-Sandbox-Pod-IP": ip, "X-Sandbox-Port": str(port)}
    try:
        async with websockets.connect(ws_url(router), additional_headers=headers, compression=None) as ws:
            assert await ws.recv() == "hi"
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1009, "message too big")
    finally:
        server.close()


async def test_per_client_limit(start_router: Callable[..., Awaitable[Router]], backend: Backend) -> None:
    router = await start_router("--websocket-max-connections-per-client=1")
    async with websockets.connect(ws_url(router), additional_headers=backend.headers()):
        upgrade = backend.headers(
            Connection="Upgrade",
            Upgrade="websocket",
            **{"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="},
        )
        resp = await raw_request(router.http_port or 0, request_bytes("GET", "/ws", upgrade))
        assert resp.status == 429
        assert resp.body == b'{"detail":"Too many concurrent WebSocket connections (limit: 1)."}'
    # The slot is released when the first one closes.
    await asyncio.sleep(0.2)
    async with websockets.connect(ws_url(router), additional_headers=backend.headers()) as ws:
        await ws.send("again")
        assert await ws.recv() == "again"


async def test_backend_refusing_the_upgrade_is_relayed(router: Router, backend: Backend) -> None:
    upgrade = backend.headers(
        Connection="Upgrade",
        Upgrade="websocket",
        **{"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="},
    )
    resp = await raw_request(router.http_port or 0, request_bytes("GET", "/status/403", upgrade))
    assert (resp.status, resp.body) == (403, b"sandbox says 403")
    assert resp.closed
    # and says so: a keep-alive client would send its next request into the closing connection (until
    # December 6 the answer carried no `Connection: close`)
    assert resp.headers.get("connection") == "close"


def _draining(router: Router) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return not router.ready

    return probe


async def test_an_open_websocket_runs_on_through_the_drain_and_is_cut_at_its_deadline(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """As an HTTP/1.1 request still running: the drain waits for it, and cuts it at its deadline (Go's
    Shutdown does not wait for hijacked connections, and until December 7 neither did this router: every
    WebSocket was cut at once, docs/router.md)."""
    router = await start_router("--shutdown-timeout=2s")
    async with websockets.connect(ws_url(router), additional_headers=backend.headers()) as ws:
        await ws.send("hi")
        assert await ws.recv() == "hi"
        stopping = asyncio.create_task(router.shutdown())
        await eventually(_draining(router), "the drain to start", 10)
        await ws.send("still there")
        assert await ws.recv() == "still there"
        await asyncio.wait_for(stopping, 10)
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None  # a close frame, not a cut (1006)
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "router shutting down")
    assert "closing 1 connection(s) still busy" in caplog.text


async def test_a_websocket_that_ends_during_the_drain_lets_it_finish(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    router = await start_router("--shutdown-timeout=20s")
    async with websockets.connect(ws_url(router), additional_headers=backend.headers()) as ws:
        stopping = asyncio.create_task(router.shutdown())
        await eventually(_draining(router), "the drain to start", 10)
        await ws.send("last")
        assert await ws.recv() == "last"
    await asyncio.wait_for(stopping, 15)
    assert "still busy" not in caplog.text


async def _upgraded(
    router: Router, headers: dict[str, str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw client connection through `router`, upgraded to a WebSocket (the `101` read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}
    key = {"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    writer.write(request_bytes("GET", "/ws", {**headers, **upgrade, **key}))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
    return reader, writer


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """Whole WebSocket frames in `data` as (opcode, unmasked payload); a trailing partial frame is left out."""
    frames, pos = [], 0
    while len(data) - pos >= 2:
        length, masked = data[pos + 1] & 0x7F, data[pos + 1] & 0x80
        head = 2 + (2 if length == 126 else 8 if length == 127 else 0)
        if length >= 126:
            length = int.from_bytes(data[pos + 2 : pos + head], "big")
        key = data[pos + head : pos + head + 4] if masked else b"\0\0\0\0"
        head += 4 if masked else 0
        if len(data) - pos < head + length:
            break
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(data[pos + head : pos + head + length]))
        frames.append((data[pos] & 0x0F, payload))
        pos += head + length
    return frames


_CLOSE_1001 = (8, struct.pack("!H", 1001) + b"router shutting down")


@pytest.mark.parametrize("mid_frame", ["neither", "client", "sandbox"])
async def test_the_drain_deadline_sends_1001_to_each_end_between_two_frames(
    start_router: Callable[..., Awaitable[Router]], mid_frame: str
) -> None:
    """A WebSocket still open at the drain's deadline gets a close frame (1001) each way before the cut:
    unmasked to the client, masked to the sandbox (as a client's). Only to an end whose stream stands
    between two frames: written inside a payload, the close frame would be read as payload. Until
    December 7 neither end got one (the client saw 1006, abnormal closure)."""
    import base64
    import hashlib

    got_by_sandbox = bytearray()
    # A frame header announcing 100 bytes, and only 10 of them: the stream is left inside the payload.
    half_from_sandbox = b"\x82\x64" + b"s" * 10
    half_from_client = b"\x82\xe4" + b"\x01\x02\x03\x04" + b"c" * 10
    whole_from_client = b"\x81\x82\x00\x00\x00\x00ok"
    sent = whole_from_client + (half_from_client if mid_frame == "client" else b"")
    arrived, ended = asyncio.Event(), asyncio.Event()

    async def sandbox(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + b"\x81\x02hi"
        )
        if mid_frame == "sandbox":
            writer.write(half_from_sandbox)
        while chunk := await reader.read(65536):
            got_by_sandbox.extend(chunk)
            if len(got_by_sandbox) >= len(sent):
                arrived.set()
        writer.close()
        ended.set()

    server, headers = await raw_backend(sandbox)
    router = await start_router("--shutdown-timeout=2s")
    try:
        reader, writer = await _upgraded(router, headers)
        assert await reader.readexactly(4) == b"\x81\x02hi"
        if mid_frame == "sandbox":
            assert await reader.readexactly(len(half_from_sandbox)) == half_from_sandbox
        writer.write(sent)  # a whole (masked) frame, then maybe half a frame
        await writer.drain()
        await asyncio.wait_for(arrived.wait(), 10)
        await asyncio.wait_for(router.shutdown(), 10)
        got_by_client = await asyncio.wait_for(reader.read(), 10)  # to EOF
        writer.close()
        await asyncio.wait_for(ended.wait(), 10)
    finally:
        server.close()
    if mid_frame == "sandbox":
        assert got_by_client == b""  # just closed
    else:
        assert _frames(got_by_client) == [_CLOSE_1001]
    if mid_frame == "client":
        assert bytes(got_by_sandbox) == sent  # just closed
    else:
        assert _frames(bytes(got_by_sandbox)) == [(1, b"ok"), _CLOSE_1001]


async def test_the_drain_deadline_closes_each_end_after_its_closing_handshake(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    """After its 1001 the router waits (a bounded part of the drain's reserve) for each end's own close frame
    and only then closes that end's connection (RFC 6455 7.1.1): a browser reports a close whose connection
    went before its answer as not clean (`wasClean=false`), aiohttp sometimes as 1006. Until December 7 both
    connections were closed right after the router's close frames."""
    import base64
    import hashlib

    sandbox_answered, ended = asyncio.Event(), asyncio.Event()
    read_by_sandbox = bytearray()
    after_answer: list[bytes] = []

    async def sandbox(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + b"\x81\x02hi"
        )
        while not _frames(bytes(read_by_sandbox)) and (chunk := await reader.read(65536)):
            read_by_sandbox.extend(chunk)
        writer.write(b"\x88\x02\x03\xe9")  # its answer: close 1001 (unmasked, as a server's)
        await writer.drain()
        sandbox_answered.set()
        after_answer.append(await reader.read())  # to EOF: the router closes once it read the answer
        writer.close()
        ended.set()

    server, headers = await raw_backend(sandbox)
    router = await start_router("--shutdown-timeout=5s")
    try:
        reader, writer = await _upgraded(router, headers)
        assert await reader.readexactly(4) == b"\x81\x02hi"
        stopping = asyncio.create_task(router.shutdown())
        assert _frames(await asyncio.wait_for(reader.readexactly(24), 10)) == [_CLOSE_1001]
        await asyncio.wait_for(sandbox_answered.wait(), 10)
        assert not reader.at_eof()  # still open, for the client's answer
        writer.write(b"\x88\x82\x00\x00\x00\x00\x03\xe9")  # close 1001, masked (a zero key) as a client's
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # then closed
        writer.close()
        await asyncio.wait_for(stopping, 10)
        await asyncio.wait_for(ended.wait(), 10)
    finally:
        server.close()
    assert _frames(bytes(read_by_sandbox)) == [_CLOSE_1001]
    assert after_answer == [b""]
