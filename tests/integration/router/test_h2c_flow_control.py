"""The DATA the h2c router drops (of streams it refused) does not use up the client's connection window.

HTTP/2 flow control has a window per connection as well as per stream (RFC 9113 6.9): every DATA frame the
client sends takes its length from both, and the receiver gives it back with WINDOW_UPDATE. The router
drops the frames of the streams it refuses (one naming another sandbox, or a credential that needs an API
call; streams over its cap; streams opened after the drain's GOAWAY), so the sandbox never sees them and
never gives their share of the connection window back: the router does. Until December 7 it did not, and
after 64 KiB of DATA on refused streams (the initial window) every stream of the connection stalled.

Raw frames on real sockets: a client that keeps to its windows, a sandbox that returns what it reads.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import hpack
import pytest

from agent_sandbox.router import Router

from .conftest import fresh_ip
from .test_h2c_pinning import END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE, SETTINGS, frame, frames

pytestmark = pytest.mark.integration

DATA, RST_STREAM, WINDOW_UPDATE = 0x0, 0x3, 0x8
REFUSED_STREAM = 0x7
INITIAL_WINDOW = 65_535
MAX_FRAME = 16_384


class CountingSandbox:
    """A raw h2c sandbox with the default windows: gives back every DATA frame's window (connection and
    stream) as it reads it, and answers each request, once the client ended it, with the byte count."""

    def __init__(self) -> None:
        self.ip = fresh_ip()
        self.port = 0
        self.streams: list[int] = []
        self.received: dict[int, int] = {}
        self.got: asyncio.Queue[int] = asyncio.Queue()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> CountingSandbox:
        self.server = await asyncio.start_server(self._serve, self.ip, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(SETTINGS, 0, 0, b""))
        encoder = hpack.Encoder()
        buf = await reader.readexactly(len(PREFACE))
        assert buf == PREFACE
        buf = b""
        while chunk := await reader.read(65536):
            buf += chunk
            got = frames(buf)
            buf = buf[sum(9 + len(payload) for *_, payload in got) :]
            for ftype, flags, stream, payload in got:
                if ftype == HEADERS and stream not in self.streams:
                    self.streams.append(stream)
                    self.received[stream] = 0
                    self.got.put_nowait(stream)
                elif ftype == DATA:
                    self.received[stream] += len(payload)
                    if payload:
                        update = struct.pack("!I", len(payload))
                        writer.write(
                            frame(WINDOW_UPDATE, 0, 0, update) + frame(WINDOW_UPDATE, 0, stream, update)
                        )
                    if flags & END_STREAM:
                        head = encoder.encode([(":status", "200")])
                        body = str(self.received[stream]).encode()
                        writer.write(
                            frame(HEADERS, END_HEADERS, stream, head) + frame(DATA, END_STREAM, stream, body)
                        )
        writer.close()


class Client:
    """A raw h2c client that keeps to its send windows (connection and stream, RFC 9113 6.9.1)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.connection_window = INITIAL_WINDOW
        self.stream_windows: dict[int, int] = {}
        self.received: list[tuple[int, int, int, bytes]] = []
        self.changed = asyncio.Event()
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        buf = b""
        while chunk := await self.reader.read(65536):
            buf += chunk
            got = frames(buf)
            buf = buf[sum(9 + len(payload) for *_, payload in got) :]
            for ftype, flags, stream, payload in got:
                self.received.append((ftype, flags, stream, payload))
                if ftype == WINDOW_UPDATE:
                    (increment,) = struct.unpack("!I", payload)
                    if stream:
                        self.stream_windows[stream] = (
                            self.stream_windows.get(stream, INITIAL_WINDOW) + increment
                        )
                    else:
                        self.connection_window += increment
            self.changed.set()
        self.changed.set()

    def open(self, stream: int, block: bytes) -> None:
        self.stream_windows[stream] = INITIAL_WINDOW
        self.writer.write(frame(HEADERS, END_HEADERS, stream, block))

    async def send(self, stream: int, size: int, end: bool = False) -> None:
        """`size` bytes of DATA on `stream`, each frame as the windows allow (waiting for WINDOW_UPDATEs)."""
        while size or end:
            step = min(size, MAX_FRAME, self.connection_window, self.stream_windows[stream])
            if size and not step:
                self.changed.clear()
                assert not self._reading.done(), f"closed; frames: {[f[:3] for f in self.received]}"
                await self.changed.wait()
                continue
            size -= step
            self.connection_window -= step
            self.stream_windows[stream] -= step
            self.writer.write(frame(DATA, END_STREAM if end and not size else 0, stream, b"u" * step))
            if end and not size:
                return

    async def until(self, received: Callable[[list[tuple[int, int, int, bytes]]], bool]) -> None:
        while not received(self.received):
            self.changed.clear()
            assert not self._reading.done(), f"closed; frames: {[f[:3] for f in self.received]}"
            await self.changed.wait()

    async def response(self, stream: int) -> bytes:
        await self.until(lambda got: any(t == DATA and f & END_STREAM and s == stream for t, f, s, _ in got))
        return b"".join(p for t, _, s, p in self.received if t == DATA and s == stream)

    def close(self) -> None:
        self._reading.cancel()
        self.writer.close()


def _post(encoder: hpack.Encoder, sandbox_id: str, ip: str, port: int) -> bytes:
    return encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/upload"),
            (":authority", "router"),
            ("x-sandbox-id", sandbox_id),
            ("x-sandbox-pod-ip", ip),
            ("x-sandbox-port", str(port)),
        ]
    )


async def test_data_on_refused_streams_does_not_stall_the_accepted_ones(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    """Streams 3 and 5 name another sandbox and are refused (GOAWAY naming 1); the client sends 80 KiB on
    them before it reads the GOAWAY (more than the whole connection window, so past its first 64 KiB only
    as the router gives the window back), then uploads 100 KiB on the accepted stream 1, which arrive whole."""
    router = await start_router("--enable-h2c")
    encoder = hpack.Encoder()
    async with CountingSandbox() as sandbox:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
        client = Client(reader, writer)
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b""))
            client.open(1, _post(encoder, "counting", sandbox.ip, sandbox.port))
            client.open(3, _post(encoder, "other", fresh_ip(), 9))
            client.open(5, _post(encoder, "other", fresh_ip(), 9))

            async def run() -> bytes:
                await client.send(3, 40 * 1024)
                await client.send(5, 40 * 1024)
                await client.send(1, 100 * 1024, end=True)
                return await client.response(1)

            # Bounded: on the old code the client waits for a connection window that never comes back.
            body = await asyncio.wait_for(run(), 15)
        finally:
            client.close()
    assert body == str(100 * 1024).encode()
    assert sandbox.streams == [1]
    goaway = [p for t, _, _, p in client.received if t == GOAWAY]
    assert [struct.unpack("!II", p) for p in goaway] == [(1, 0)]


async def test_data_on_streams_refused_by_the_drain_does_not_stall_the_running_ones(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    """SIGTERM's drain (GOAWAY(NO_ERROR) naming 1): streams 3 and 5, opened after it, are refused
    (RST_STREAM(REFUSED_STREAM)) and their 80 KiB dropped; stream 1, running, still uploads its 100 KiB and
    gets its answer before the connection closes."""
    router = await start_router("--enable-h2c", "--shutdown-timeout=20s")
    encoder = hpack.Encoder()
    async with CountingSandbox() as sandbox:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
        client = Client(reader, writer)
        stopping: asyncio.Task[None] | None = None
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b""))
            client.open(1, _post(encoder, "counting", sandbox.ip, sandbox.port))

            async def run() -> bytes:
                nonlocal stopping
                assert await sandbox.got.get() == 1
                stopping = asyncio.create_task(router.shutdown())
                await client.until(lambda got: any(t == GOAWAY for t, *_ in got))
                for stream in (3, 5):
                    client.open(stream, _post(encoder, "counting", sandbox.ip, sandbox.port))
                    await client.send(stream, 40 * 1024)
                await client.send(1, 100 * 1024, end=True)
                return await client.response(1)

            body = await asyncio.wait_for(run(), 15)
        finally:
            client.close()
        assert stopping is not None
        await asyncio.wait_for(stopping, 15)
    assert body == str(100 * 1024).encode()
    assert sandbox.streams == [1]
    goaway = [p for t, _, _, p in client.received if t == GOAWAY]
    assert [struct.unpack("!II", p) for p in goaway] == [(1, 0)]
    refused = [(s, p) for t, _, s, p in client.received if t == RST_STREAM]
    assert refused == [(stream, struct.pack("!I", REFUSED_STREAM)) for stream in (3, 5)]
