"""h2c header blocks at the router's limits: large metadata, and what a connection-level error tells the client.

The router decodes every client header block (docs/design/router-h2c-hpack.md). Its decoder refused any block
whose header list (RFC 7541 4.1 sizes) was over 64 KiB, `hpack`'s default, and ended the connection: a gRPC call
with 70 KB of metadata, which the HTTP/1.1 path (`--max-request-header-bytes`, 1 MiB) and gRPC servers such as
grpc-go (16 MiB) accept, killed every call on its connection. And that GOAWAY named stream 0 even when streams
had already been forwarded: a client reads that as "none of your streams was processed" (RFC 9113 6.8) and gRPC
retries such calls transparently, so a call the sandbox had run could run twice.

Real router in-process, a real grpcio sandbox and a raw-frame sandbox.
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
    GOAWAY,
    HEADERS,
    SETTINGS,
    DecodingSandbox,
    MetadataSandbox,
    _read_until_goaway,
    _request,
)
from .test_h2c_pinning import OWN_CONNECTION, PREFACE, frame

pytestmark = pytest.mark.integration

BIG = [("grpc.max_metadata_size", 4 << 20), ("grpc.absolute_max_metadata_size", 4 << 20)]


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c")


@pytest.mark.parametrize("size", [20_000, 70_000, 300_000], ids=["20k", "70k", "300k"])
async def test_large_metadata_reaches_the_sandbox(h2c_router: Router, size: int) -> None:
    """grpcio, metadata over the default frame size and over 64 KiB (one value, and many fields), while a
    streaming call runs on the same connection: every call is served, the metadata arrive as sent, and the
    streaming call is not disturbed."""
    sandbox = MetadataSandbox("alpha", options=BIG)
    await sandbox.server.start()
    try:
        target = f"127.0.0.1:{h2c_router.http_port}"
        base = (*sandbox.metadata(), ("authorization", "Bearer secret-token"))
        one = (*base, ("x-big", "v" * size))
        many = (*base, *((f"x-part-{i}", f"{i}" * 1000) for i in range(size // 1000)))
        async with grpc.aio.insecure_channel(target, options=[*OWN_CONNECTION, *BIG]) as channel:
            who = channel.unary_unary("/echo.Echo/Who")
            assert await who(b"", metadata=base, timeout=10) == b"alpha"
            count = channel.unary_stream("/echo.Echo/Count")(b"10", metadata=base, timeout=10)
            streamed = asyncio.ensure_future(_collect(count))
            await asyncio.sleep(0.1)
            assert await who(b"", metadata=one, timeout=10) == b"alpha"
            assert await who(b"", metadata=many, timeout=10) == b"alpha"
            assert len(await streamed) == 10
        assert len(sandbox.seen) == 4
        assert sandbox.seen[2]["x-big"] == "v" * size
        assert sum(k.startswith("x-part-") for k in sandbox.seen[3]) == size // 1000
        assert all("authorization" not in seen for seen in sandbox.seen)
    finally:
        await sandbox.server.stop(None)


async def _collect(call: object) -> list[bytes]:
    return [m async for m in call]  # type: ignore[attr-defined]


async def test_a_block_that_ends_the_connection_names_the_streams_forwarded(h2c_router: Router) -> None:
    """Stream 1 reached the sandbox, then a block the router cannot decode: the connection ends with a GOAWAY
    naming stream 1 (it may have been processed, so it is not retried), not stream 0."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(
                PREFACE
                + frame(SETTINGS, 0, 0, b"")
                + frame(HEADERS, END_HEADERS, 1, encoder.encode(_request(sandbox.routing())))
            )
            await writer.drain()
            await sandbox.wait_blocks(1)
            # an index far past the static and dynamic tables: no decoder can take it
            writer.write(frame(HEADERS, END_HEADERS, 3, b"\xff\xff\xff\x7f"))
            await writer.drain()
            got = await _read_until_goaway(reader)
        finally:
            writer.close()
    goaway = next(p for t, _, _, p in got if t == GOAWAY)
    assert int.from_bytes(goaway[:4], "big") == 1
    assert int.from_bytes(goaway[4:8], "big") == 0x9  # COMPRESSION_ERROR (RFC 9113 4.3)
