"""h2c stream states: a client header block reaches the sandbox only as a request the router checked, or as
the trailers of a stream the router accepted and the client still has open.

The router decided "new stream or trailers?" by the stream id alone: a HEADERS on a stream id at or below
the last accepted one was taken for trailers and forwarded without the target or credential check, even
on a stream the client never opened, or had already ended (END_STREAM, RST_STREAM), and after a refusal
also on any even-numbered stream. A compliant HTTP/2 server (grpc-go, nghttp2) ends the connection for
it (RFC 9113 5.1, 5.1.1), but a server that is not could run it as a request no check covered. The router
now follows which streams the client has open and ends the connection with GOAWAY(PROTOCOL_ERROR) naming
the last forwarded stream, forwarding nothing of the offending read. A client PUSH_PROMISE (RFC 9113 8.4:
clients never push) is the same protocol error, not relayed unparsed.

Real router in-process, raw-frame sandboxes that decode every header block reaching them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import hpack
import pytest

from agent_sandbox.router import Router

from .conftest import fresh_ip
from .test_h2c_authz import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    SETTINGS,
    DecodingSandbox,
    _read_until_goaway,
    _request,
    _still_open,
)
from .test_h2c_pinning import PREFACE, frame

pytestmark = pytest.mark.integration

RST_STREAM, PUSH_PROMISE = 0x3, 0x5
PROTOCOL_ERROR, NO_ERROR, CANCEL = 0x1, 0x0, 0x8


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c")


def _smuggled() -> list[tuple[str, str]]:
    """A request without routing headers or credential: on its own, the router would refuse it (400)."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/echo.Echo/Smuggled"),
        (":authority", "router"),
        ("content-type", "application/grpc"),
    ]


async def _goaway(reader: asyncio.StreamReader) -> tuple[int, int]:
    """(last stream, error code) of the router's GOAWAY; the connection must end after it."""
    got = await _read_until_goaway(reader)
    payload = next(p for t, _, _, p in got if t == GOAWAY)
    async with asyncio.timeout(5):
        while await reader.read(65536):
            pass
    return int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big")


async def _open(h2c_router: Router, first: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
    writer.write(PREFACE + frame(SETTINGS, 0, 0, b"") + first)
    await writer.drain()
    return reader, writer


def _paths(sandbox: DecodingSandbox) -> list[tuple[int, bytes | None]]:
    return [(stream, dict(headers).get(b":path")) for stream, _, headers in sandbox.blocks]


async def test_headers_on_a_never_opened_stream_below_the_last_accepted_are_a_protocol_error(
    h2c_router: Router,
) -> None:
    """Streams 1 and 5 accepted (both still open), then a HEADERS on stream 3, which the client never
    opened: it used to reach the sandbox as "trailers" of an accepted stream, unchecked. Now GOAWAY
    (PROTOCOL_ERROR) naming stream 5, and the sandbox never sees stream 3."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        request = encoder.encode(_request(sandbox.routing()))
        reader, writer = await _open(
            h2c_router, frame(HEADERS, END_HEADERS, 1, request) + frame(HEADERS, END_HEADERS, 5, request)
        )
        try:
            await sandbox.wait_blocks(2)
            writer.write(frame(HEADERS, END_HEADERS, 3, encoder.encode(_smuggled())))
            await writer.drain()
            assert await _goaway(reader) == (5, PROTOCOL_ERROR)
        finally:
            writer.close()
        await asyncio.sleep(0.2)
    assert [stream for stream, _ in _paths(sandbox)] == [1, 5]


@pytest.mark.parametrize("ended_by", ["data", "headers", "trailers", "rst_stream"])
async def test_headers_after_the_client_ended_its_stream_are_refused(
    h2c_router: Router, ended_by: str
) -> None:
    """The client ended stream 1 (END_STREAM on its DATA, on its request HEADERS, on its trailers, or
    RST_STREAM); another header block on stream 1 is a protocol error (RFC 9113 5.1: half-closed (local)
    or closed), not trailers: GOAWAY(PROTOCOL_ERROR) naming stream 1, the block never forwarded."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        request = encoder.encode(_request(sandbox.routing()))
        first = {
            "data": frame(HEADERS, END_HEADERS, 1, request) + frame(DATA, END_STREAM, 1, b"\x00" * 5),
            "headers": frame(HEADERS, END_HEADERS | END_STREAM, 1, request),
            "trailers": frame(HEADERS, END_HEADERS, 1, request)
            + frame(HEADERS, END_HEADERS | END_STREAM, 1, encoder.encode([("x-trailer", "t")])),
            "rst_stream": frame(HEADERS, END_HEADERS, 1, request)
            + frame(RST_STREAM, 0, 1, CANCEL.to_bytes(4, "big")),
        }[ended_by]
        reader, writer = await _open(h2c_router, first)
        try:
            await sandbox.wait_blocks(2 if ended_by == "trailers" else 1)
            writer.write(frame(HEADERS, END_HEADERS, 1, encoder.encode(_smuggled())))
            await writer.drain()
            assert await _goaway(reader) == (1, PROTOCOL_ERROR)
        finally:
            writer.close()
        await asyncio.sleep(0.2)
    assert b"/echo.Echo/Smuggled" not in [path for _, path in _paths(sandbox)]
    assert len(sandbox.blocks) == (2 if ended_by == "trailers" else 1)


async def test_a_second_header_block_without_end_stream_is_refused(h2c_router: Router) -> None:
    """Trailers end the stream (RFC 9113 8.1); a second block on an open stream that does not is a malformed
    request the router need not pass on (a stream error it may treat as a connection error, 5.4.1)."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        reader, writer = await _open(
            h2c_router, frame(HEADERS, END_HEADERS, 1, encoder.encode(_request(sandbox.routing())))
        )
        try:
            await sandbox.wait_blocks(1)
            writer.write(frame(HEADERS, END_HEADERS, 1, encoder.encode(_smuggled())))
            await writer.drain()
            assert await _goaway(reader) == (1, PROTOCOL_ERROR)
        finally:
            writer.close()
        await asyncio.sleep(0.2)
    assert _paths(sandbox) == [(1, b"/echo.Echo/Who")]


@pytest.mark.parametrize("stream", [1, 2, 4], ids=["ended", "even-below", "even-above"])
async def test_after_a_refusal_only_open_accepted_streams_get_header_blocks(
    h2c_router: Router, stream: int
) -> None:
    """Stream 1 accepted and ended by the client, stream 3 refused (another sandbox: graceful GOAWAY naming
    1). Then a header block on the ended stream 1, or on an even stream (clients open odd ones only, RFC
    9113 5.1.1): after a refusal every block at or below the last accepted stream, and every frame of an
    even stream, was relayed as trailers, unchecked. Now a protocol error; nothing of it forwarded."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        other = [("x-sandbox-id", "beta"), ("x-sandbox-pod-ip", fresh_ip()), ("x-sandbox-port", "1")]
        reader, writer = await _open(
            h2c_router,
            frame(HEADERS, END_HEADERS, 1, encoder.encode(_request(sandbox.routing())))
            + frame(DATA, END_STREAM, 1, b"\x00" * 5)
            + frame(HEADERS, END_HEADERS | END_STREAM, 3, encoder.encode(_request(other))),
        )
        try:
            got = await _read_until_goaway(reader)
            graceful = next(p for t, _, _, p in got if t == GOAWAY)
            assert (int.from_bytes(graceful[:4], "big"), int.from_bytes(graceful[4:8], "big")) == (
                1,
                NO_ERROR,
            )
            await sandbox.wait_blocks(1)
            writer.write(frame(HEADERS, END_HEADERS, stream, encoder.encode(_smuggled())))
            await writer.drain()
            assert await _goaway(reader) == (1, PROTOCOL_ERROR)
        finally:
            writer.close()
        await asyncio.sleep(0.2)
    assert _paths(sandbox) == [(1, b"/echo.Echo/Who")]


async def test_a_client_push_promise_is_a_protocol_error(h2c_router: Router) -> None:
    """RFC 9113 8.4: a client never sends PUSH_PROMISE. It carries a header block the router did not check
    and used to relay unparsed (its CONTINUATIONs then ended the connection as out of place)."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        reader, writer = await _open(
            h2c_router, frame(HEADERS, END_HEADERS, 1, encoder.encode(_request(sandbox.routing())))
        )
        try:
            await sandbox.wait_blocks(1)
            promised = (3).to_bytes(4, "big") + encoder.encode(_smuggled())
            writer.write(frame(PUSH_PROMISE, END_HEADERS, 1, promised))
            await writer.drain()
            assert await _goaway(reader) == (1, PROTOCOL_ERROR)
        finally:
            writer.close()
        await asyncio.sleep(0.2)
    assert not any(ftype == PUSH_PROMISE for ftype in _frame_types(sandbox))
    assert _paths(sandbox) == [(1, b"/echo.Echo/Who")]


def _frame_types(sandbox: DecodingSandbox) -> list[int]:
    data, pos, out = bytes(sandbox.received), len(PREFACE), []
    while len(data) - pos >= 9:
        out.append(data[pos + 3])
        pos += 9 + int.from_bytes(data[pos : pos + 3], "big")
    return out


async def test_streams_beyond_the_open_stream_cap_are_refused_gracefully(
    h2c_router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router's record of open streams is bounded: a stream that would exceed it is refused like one
    naming another sandbox (GOAWAY naming the last accepted stream; the client retries it on a new
    connection), the open ones carry on (their trailers forwarded), and the refused stream's own trailers,
    sent before the client read the GOAWAY, are dropped without ending the connection."""
    from agent_sandbox.router import _h2c_frames

    monkeypatch.setattr(_h2c_frames, "_MAX_OPEN_STREAMS", 2)
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        request = encoder.encode(_request(sandbox.routing()))
        reader, writer = await _open(
            h2c_router,
            frame(HEADERS, END_HEADERS, 1, request)
            + frame(HEADERS, END_HEADERS, 3, request)
            + frame(HEADERS, END_HEADERS, 5, request),
        )
        try:
            got = await _read_until_goaway(reader)
            graceful = next(p for t, _, _, p in got if t == GOAWAY)
            assert (int.from_bytes(graceful[:4], "big"), int.from_bytes(graceful[4:8], "big")) == (
                3,
                NO_ERROR,
            )
            trailers = encoder.encode([("x-trailer", "t")])
            writer.write(
                frame(HEADERS, END_HEADERS | END_STREAM, 5, trailers)
                + frame(HEADERS, END_HEADERS | END_STREAM, 1, trailers)
            )
            await writer.drain()
            await sandbox.wait_blocks(3)
            await asyncio.sleep(0.2)
            assert not writer.is_closing()
            assert await _still_open(reader)
        finally:
            writer.close()
    assert [(stream, flags & END_STREAM) for stream, flags, _ in sandbox.blocks] == [
        (1, 0),
        (3, 0),
        (1, END_STREAM),
    ]


async def test_split_trailers_of_an_open_stream_are_still_forwarded(h2c_router: Router) -> None:
    """The usual case stays as it was: request, DATA, then trailers split over a CONTINUATION, all in one
    write, followed by the next stream; every block reaches the sandbox."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        request = encoder.encode(_request(sandbox.routing()))
        trailers = encoder.encode([("x-trailer", "t"), ("x-more", "m")])
        reader, writer = await _open(
            h2c_router,
            frame(HEADERS, END_HEADERS, 1, request)
            + frame(DATA, 0, 1, b"\x00" * 5)
            + frame(HEADERS, END_STREAM, 1, trailers[:3])
            + frame(CONTINUATION, END_HEADERS, 1, trailers[3:])
            + frame(HEADERS, END_HEADERS | END_STREAM, 3, request),
        )
        try:
            await sandbox.wait_blocks(3)
            await asyncio.sleep(0.2)
            assert await _still_open(reader)
        finally:
            writer.close()
    assert not sandbox.errors, sandbox.errors
    assert [(stream, flags & END_STREAM) for stream, flags, _ in sandbox.blocks] == [
        (1, 0),
        (1, END_STREAM),
        (3, END_STREAM),
    ]
