"""h2c header blocks keep their size through the router (docs/design/router-h2c-hpack.md).

Until December 7 the router re-encoded every header block without a dynamic table: a client's 1-byte
reference to a 4 KB table entry reached the sandbox as 4 KB of literal, so 66 KB sent made 240 MB in one
read, before any credential was checked. Its encoders now keep a table as the peers' do, and what
re-encoding may still add (tables that differ) is bounded: GOAWAY(ENHANCE_YOUR_CALM) past the budget.

Real router in-process, a raw-frame sandbox that decodes what reaches it, and real grpcio.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import hpack
import pytest

from agent_sandbox.router import Router

from .test_h2c_authz import (
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    SETTINGS,
    DecodingSandbox,
    MetadataSandbox,
    _read_until_goaway,
    _read_until_settings,
    _request,
)
from .test_h2c_pinning import OWN_CONNECTION, PREFACE, frame

pytestmark = pytest.mark.integration

BIG = "v" * 3500
"""A field that fits a 4 KiB table with the request's: the client's encoder refers to it after once."""


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c")


def _amplifying(sandbox: DecodingSandbox, blocks: int) -> tuple[bytes, list[bytes]]:
    """The first request, then `blocks` requests of 250 copies of `BIG`: ~300 bytes each from the client's
    encoder (table references), ~900 KB decoded."""
    encoder = hpack.Encoder()
    request = _request([*sandbox.routing(), *[("x-big", BIG)] * 250])
    first = frame(HEADERS, END_HEADERS | END_STREAM, 1, encoder.encode(request))
    rest = [
        frame(HEADERS, END_HEADERS | END_STREAM, 3 + 2 * i, encoder.encode(request)) for i in range(blocks)
    ]
    assert max(map(len, rest)) < 400
    return first, rest


async def test_table_references_reach_the_sandbox_as_references(h2c_router: Router) -> None:
    """A sandbox that allows a 4 KiB table gets each block about as large as the client sent it (no
    credential needed to send them), and decodes every field."""
    async with DecodingSandbox(table_size=4096) as sandbox:
        sandbox.decoder.max_header_list_size = 1 << 21
        first, rest = _amplifying(sandbox, 20)
        _, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b"") + first)
            await writer.drain()
            await sandbox.wait_blocks(1)
            received = len(sandbox.received)
            writer.write(b"".join(rest))
            await writer.drain()
            await sandbox.wait_blocks(21)
        finally:
            writer.close()
    assert not sandbox.errors, sandbox.errors
    assert len(sandbox.received) - received < 2 * sum(map(len, rest))  # was 20 x 875 KB
    assert all(sum(k == b"x-big" for k, _ in headers) == 250 for _, _, headers in sandbox.blocks)


async def test_re_encoding_past_the_budget_ends_the_connection(h2c_router: Router) -> None:
    """A sandbox that allows no table: the client's references must go to it as literals, ~3,000 times as
    large. Past the budget (32 times the header bytes received plus 1 MiB) the router ends the connection with
    GOAWAY(ENHANCE_YOUR_CALM) naming the last stream forwarded, having sent no more than that."""
    async with DecodingSandbox(table_size=0) as sandbox:
        first, rest = _amplifying(sandbox, 40)
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b"") + first)
            await writer.drain()
            await sandbox.wait_blocks(1)
            await _read_until_settings(reader)  # the sandbox's, past the router: its table size is known
            received = len(sandbox.received)
            writer.write(b"".join(rest))
            await writer.drain()
            got = await _read_until_goaway(reader)
        finally:
            writer.close()
    goaway = next(p for t, _, _, p in got if t == GOAWAY)
    assert int.from_bytes(goaway[4:8], "big") == 0xB  # ENHANCE_YOUR_CALM
    last = int.from_bytes(goaway[:4], "big")
    assert 1 < last < 3 + 2 * 40
    sent_in = len(first) + sum(map(len, rest))
    assert len(sandbox.received) - received <= 32 * sent_in + (1 << 20) + 900_000


async def test_grpc_with_large_repeated_metadata(h2c_router: Router) -> None:
    """grpcio, 1,000 calls on one connection, each with a 2 KiB metadata value and a 2 KiB bearer token
    (dropped): every call is served with its metadata, far below the re-encoding budget."""
    sandbox = MetadataSandbox("alpha")
    await sandbox.server.start()
    try:
        target = f"127.0.0.1:{h2c_router.http_port}"
        metadata = (*sandbox.metadata(), ("authorization", "Bearer " + "t" * 2048), ("x-meta", "m" * 2048))
        async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
            who = channel.unary_unary("/echo.Echo/Who")
            for _ in range(1000):
                assert await who(b"", metadata=metadata, timeout=10) == b"alpha"
        assert len(sandbox.seen) == 1000
        assert all(seen["x-meta"] == "m" * 2048 and "authorization" not in seen for seen in sandbox.seen)
    finally:
        await sandbox.server.stop(None)
