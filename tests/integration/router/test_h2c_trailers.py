"""h2c trailers are filtered as HTTP/1.1's, both ways: no routing, credential or hop-by-hop field in a relayed
trailer section (`_request.trailer_allowed`, docs/router.md).

Until December 7 the HTTP/1.1 path kept such fields out of relayed trailers while h2c relayed them: a
request's trailing HEADERS kept `x-sandbox-namespace`, `x-sandbox-pod-ip`, `x-forwarded-for` (only
`authorization` and the connection-specific fields were dropped), and a response's trailers reached the
client unread. A sandbox (or a client library) that merges trailers into headers saw values the router
never checked. Response blocks are now decoded and re-encoded like the client's, so a real gRPC client must
still read every response through the router.

Real router in-process; a raw-frame sandbox that decodes what reaches it and answers with a trailer section
of its own, and a real grpcio client and server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import hpack
import pytest

from agent_sandbox.router import Router

from .conftest import fresh_ip
from .test_h2c_authz import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    SETTINGS,
    DecodingSandbox,
    _request,
)
from .test_h2c_pinning import GOAWAY, OWN_CONNECTION, PREFACE, frame, frames

pytestmark = pytest.mark.integration

# Fields HTTP/1.1 keeps out of relayed trailers, in both directions.
KEPT_OUT = [
    ("x-sandbox-namespace", "other"),
    ("x-sandbox-pod-ip", "10.9.9.9"),
    ("x-sandbox-id", "beta"),
    ("authorization", "Bearer secret-token"),
    ("connection", "close"),
    ("x-forwarded-for", "1.2.3.4"),
    ("host", "elsewhere"),
]


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c")


class AnsweringSandbox(DecodingSandbox):
    """A `DecodingSandbox` that answers each request whose trailers it has decoded: a response head, a DATA
    frame and a trailer section (split over a CONTINUATION) with `KEPT_OUT` among its fields, from an
    encoder that indexes every field it may (so the router must follow the sandbox's HPACK table)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = hpack.Encoder()
        self.writer: asyncio.StreamWriter | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        await super()._serve(reader, writer)

    def answer(self, stream: int) -> None:
        assert self.writer is not None
        head = self.encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        trailers = self.encoder.encode([("grpc-status", "0"), *KEPT_OUT, ("x-trailer", "t")])
        self.writer.write(
            frame(HEADERS, END_HEADERS, stream, head)
            + frame(DATA, 0, stream, b"\x00\x00\x00\x00\x02ok")
            + frame(HEADERS, END_STREAM, stream, trailers[:4])
            + frame(CONTINUATION, END_HEADERS, stream, trailers[4:])
        )


async def _response_blocks(
    reader: asyncio.StreamReader, streams: int
) -> list[tuple[int, int, list[tuple[bytes, bytes]]]]:
    """(stream, flags, fields) of the header blocks the client reads, until `streams` streams ended."""
    decoder = hpack.Decoder()
    seen = block = b""
    first = (0, 0)
    blocks: list[tuple[int, int, list[tuple[bytes, bytes]]]] = []
    async with asyncio.timeout(10):
        while sum(1 for _, flags, _ in blocks if flags & END_STREAM) < streams:
            chunk = await reader.read(65536)
            assert chunk, "the router closed the connection"
            seen += chunk
            got = frames(seen)
            seen = seen[sum(9 + len(p) for *_, p in got) :]
            for ftype, flags, stream, payload in got:
                if ftype == HEADERS:
                    block, first = payload, (stream, flags)
                elif ftype == CONTINUATION:
                    block += payload
                else:
                    continue
                if flags & END_HEADERS:
                    fields = [(bytes(k), bytes(v)) for k, v in decoder.decode(block, raw=True)]
                    blocks.append((*first, fields))
    return blocks


async def test_trailers_are_filtered_both_ways(h2c_router: Router) -> None:
    """Two calls on one connection (the second's blocks name the sandbox's table entries the first's added):
    the sandbox sees each request's trailers without `KEPT_OUT`, the client each response whole but its
    trailers without `KEPT_OUT`."""
    sandbox = AnsweringSandbox()
    async with sandbox:
        encoder = hpack.Encoder()
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b""))
            for stream, blocks_seen in ((1, 2), (3, 4)):
                request = encoder.encode(_request(sandbox.routing()))  # the second: mostly table references
                trailers = encoder.encode([*KEPT_OUT, ("x-request-trailer", "r")])
                writer.write(
                    frame(HEADERS, END_HEADERS, stream, request)
                    + frame(DATA, 0, stream, b"\x00\x00\x00\x00\x01x")
                    + frame(HEADERS, END_HEADERS | END_STREAM, stream, trailers)
                )
                await writer.drain()
                await sandbox.wait_blocks(blocks_seen)
                sandbox.answer(stream)
            blocks = await _response_blocks(reader, 2)
        finally:
            writer.close()
    assert not sandbox.errors, sandbox.errors
    # client -> sandbox
    assert [(stream, flags & END_STREAM) for stream, flags, _ in sandbox.blocks] == [
        (1, 0),
        (1, END_STREAM),
        (3, 0),
        (3, END_STREAM),
    ]
    assert sandbox.blocks[1][2] == sandbox.blocks[3][2] == [(b"x-request-trailer", b"r")]
    assert dict(sandbox.blocks[2][2])[b":path"] == b"/echo.Echo/Who"
    # sandbox -> client
    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    kept = [(b"grpc-status", b"0"), (b"x-trailer", b"t")]
    assert [(stream, flags & END_STREAM, fields) for stream, flags, fields in blocks] == [
        (1, 0, head),
        (1, END_STREAM, kept),
        (3, 0, head),
        (3, END_STREAM, kept),
    ]


class TrailingServer:
    """A real gRPC server that answers with trailing metadata naming routing fields and one of its own."""

    def __init__(self) -> None:
        self.ip = fresh_ip()
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "echo.Echo", {"Who": grpc.unary_unary_rpc_method_handler(self._who)}
                ),
            )
        )
        self.port = self.server.add_insecure_port(f"{self.ip}:0")

    async def _who(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        context.set_trailing_metadata(
            (("x-sandbox-namespace", "other"), ("x-sandbox-pod-ip", "10.9.9.9"), ("x-kept", "yes"))
        )
        return b"hello " + request

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-sandbox-id", "alpha"), ("x-sandbox-pod-ip", self.ip), ("x-sandbox-port", str(self.port)))


@pytest.fixture
async def trailing_server() -> AsyncIterator[TrailingServer]:
    server = TrailingServer()
    await server.server.start()
    try:
        yield server
    finally:
        await server.server.stop(None)


async def test_grpc_trailing_metadata_through_the_router(
    h2c_router: Router, trailing_server: TrailingServer
) -> None:
    """grpcio reads the re-encoded responses of several calls on one connection; its trailing metadata
    arrives without the routing fields, with its own."""
    target = f"127.0.0.1:{h2c_router.http_port}"
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        who = channel.unary_unary("/echo.Echo/Who")
        for i in range(3):
            call = who(b"%d" % i, metadata=trailing_server.metadata(), timeout=10)
            assert await call == b"hello %d" % i
            trailing = dict(await call.trailing_metadata() or ())
            assert trailing.get("x-kept") == "yes"
            assert "x-sandbox-namespace" not in trailing
            assert "x-sandbox-pod-ip" not in trailing


async def test_a_broken_sandbox_block_ends_the_connection_after_the_frames_before(h2c_router: Router) -> None:
    """A sandbox block that does not decode (an index past its HPACK table) after a good head and DATA: the
    client reads those, then GOAWAY(COMPRESSION_ERROR) naming the stream forwarded, and the connection
    closes; nothing of the broken block reaches it."""
    sandbox = AnsweringSandbox()
    async with sandbox:
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b""))
            writer.write(
                frame(
                    HEADERS, END_HEADERS | END_STREAM, 1, hpack.Encoder().encode(_request(sandbox.routing()))
                )
            )
            await writer.drain()
            await sandbox.wait_blocks(1)
            assert sandbox.writer is not None
            head = sandbox.encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
            sandbox.writer.write(
                frame(HEADERS, END_HEADERS, 1, head)
                + frame(DATA, 0, 1, b"\x00\x00\x00\x00\x02ok")
                + frame(HEADERS, END_STREAM, 1, b"\xff")  # an index split over the CONTINUATION
                + frame(CONTINUATION, END_HEADERS, 1, b"\xff\x7f")  # 127 + 16,383 + ...: no such entry
            )
            seen = b""
            async with asyncio.timeout(10):
                while chunk := await reader.read(65536):
                    seen += chunk
        finally:
            writer.close()
    got = [
        (ftype, flags, stream, payload) for ftype, flags, stream, payload in frames(seen) if ftype != SETTINGS
    ]
    assert [(ftype, stream) for ftype, _, stream, _ in got] == [(HEADERS, 1), (DATA, 1), (GOAWAY, 0)]
    assert [(bytes(k), bytes(v)) for k, v in hpack.Decoder().decode(got[0][3], raw=True)] == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
    ]
    assert got[2][3] == (1).to_bytes(4, "big") + (0x9).to_bytes(4, "big")  # last stream 1, COMPRESSION_ERROR
