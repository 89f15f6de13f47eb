"""How the router reads a request's framing off the wire, whatever TCP does to it: trailer fields (never
head fields; relayed as trailers both ways), an unmeetable `Expect` (417 at once), an HTTP/0.9 request line
(400 at once), and complete requests ahead of bytes that do not parse (answered, then the 400).

Raw bytes to a real in-process router and real sandbox stand-ins (tests/unit/router/test_request_reader.py
feeds the same bytes to the reader alone).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools
import pytest

from agent_sandbox.router import Router

from .conftest import Backend, fresh_ip, raw_backend, raw_request, request_bytes

pytestmark = pytest.mark.integration


@dataclass
class _Answer:
    status: int
    body: bytes = b""


async def answers(port: int, *writes: bytes, within: float = 10.0) -> tuple[list[_Answer], bytes]:
    """Send `writes` (one write each), read until the router closes: the responses in order, and the raw
    bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for data in writes:
            writer.write(data)
            await writer.drain()
        raw = b""
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                raw += chunk
    finally:
        writer.close()
    got: list[_Answer] = []

    class Collector:
        def on_message_begin(self) -> None:
            got.append(_Answer(0))

        def on_headers_complete(self) -> None:
            got[-1].status = parser.get_status_code()

        def on_body(self, body: bytes) -> None:
            got[-1].body += body

    parser = httptools.HttpResponseParser(Collector())
    parser.feed_data(raw)
    return got, raw


MALFORMED = {"detail": "Malformed HTTP request."}


@pytest.mark.parametrize("split", [False, True], ids=["one write", "trailers in a later write"])
async def test_trailers_are_relayed_as_trailers_and_never_route(router: Router, split: bool) -> None:
    """Until December 7 a trailer read with the head was taken for a header: `X-Sandbox-Pod-IP` made the
    request a 400 (a duplicate), `X-Sandbox-Namespace` routed it elsewhere, `Host` became X-Forwarded-Host,
    `Authorization` the credential checked; read later, trailers were dropped. Response trailers were
    dropped too (Go's ReverseProxy relays both)."""
    seen: dict[str, bytes] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["head"] = await reader.readuntil(b"\r\n\r\n")
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        seen["body"] = body
        seen["trailers"] = (await reader.readuntil(b"\r\n\r\n"))[:-2]
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum, Keep-Alive\r\n\r\n"
            b"2\r\nok\r\n0\r\nX-Checksum: abc123\r\nKeep-Alive: timeout=5\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server, headers = await raw_backend(serve)
    head = request_bytes(
        "PUT",
        "/v1/files/t",
        {**headers, "Transfer-Encoding": "chunked", "Trailer": "X-Digest, Host", "Connection": "close"},
    )
    rest = (
        b"5\r\nhello\r\n0\r\n"
        + f"X-Sandbox-Pod-IP: {fresh_ip()}\r\nX-Sandbox-Namespace: other\r\nHost: evil.example\r\n".encode()
        + b"Authorization: Bearer stolen\r\nX-Digest: d1\r\n\r\n"
    )
    try:
        got, raw = await answers(router.http_port or 0, *((head, rest) if split else (head + rest,)))
    finally:
        server.close()
    assert [(a.status, a.body) for a in got] == [(200, b"ok")], raw
    upstream_head = seen["head"].decode("latin-1").lower()
    assert "x-forwarded-host: router.test\r\n" in upstream_head
    assert "trailer: x-digest\r\n" in upstream_head
    assert "evil" not in upstream_head
    assert "other" not in upstream_head
    assert "stolen" not in upstream_head
    assert (seen["body"], seen["trailers"]) == (b"hello", b"X-Digest: d1\r\n")
    response_head, _, response_body = raw.partition(b"\r\n\r\n")
    assert b"\r\nTrailer: X-Checksum\r\n" in response_head + b"\r\n"
    assert response_body.endswith(b"2\r\nok\r\n0\r\nX-Checksum: abc123\r\n\r\n")


async def test_an_unmeetable_expectation_is_refused_at_once(router: Router, backend: Backend) -> None:
    """As Go's server. Until December 7 the `Expect` was dropped and the request forwarded: the client waited
    for the expectation's answer, the sandbox for the body, and the client got the sandbox's 408 after 60 s."""
    data = request_bytes("POST", "/upload", {**backend.headers(), "Expect": "200-ok", "Content-Length": "10"})
    resp = await raw_request(router.http_port or 0, data, within=10)
    assert resp.status == 417, resp
    assert json.loads(resp.body) == {"detail": "Unsupported Expect header: only 100-continue is supported."}
    assert resp.closed
    assert backend.seen == []
    assert backend.uploads == []


async def test_an_http09_request_line_is_refused_at_once(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    """docs/router.md promised 400; until December 7 a line sent alone got 408 after the header timeout."""
    router = await start_router("--read-header-timeout=60s")
    resp = await raw_request(router.http_port or 0, b"GET /v1/files/x\r\n", within=10)
    assert (resp.status, json.loads(resp.body), resp.closed) == (400, MALFORMED, True)


async def test_requests_ahead_of_garbage_are_answered_then_the_400(router: Router, backend: Backend) -> None:
    """As Go's server. Until December 7 only the 400 came: the upload ahead of it, read whole in the same
    packet, was never sent to the sandbox."""
    upload = request_bytes("POST", "/upload", backend.headers(), b"hel")
    got, raw = await answers(router.http_port or 0, upload + b"BOGUS\r\n\r\n")
    assert [a.status for a in got] == [200, 400], raw
    assert json.loads(got[0].body)["received"] == 3
    assert json.loads(got[1].body) == MALFORMED
    assert backend.uploads == [3]


async def test_a_request_being_served_is_not_cut_by_garbage_behind_it(
    router: Router, backend: Backend
) -> None:
    """A request in flight, another queued behind it, then bytes that do not parse: both are answered in
    order, then the 400 (until December 7 the 400 went out at once and the one in flight was cut)."""
    data = (
        request_bytes("GET", "/sleep/0.3", backend.headers())
        + request_bytes("GET", "/second", backend.headers())
        + b"\x00\x01 not http\r\n\r\n"
    )
    got, raw = await answers(router.http_port or 0, data)
    assert [a.status for a in got] == [200, 200, 400], raw
    assert got[0].body == b"slept"
    assert json.loads(got[1].body)["raw_path"] == "/second"


async def test_a_queued_request_whose_body_breaks_is_dropped_after_the_one_ahead(
    router: Router, backend: Backend
) -> None:
    broken = (
        request_bytes("POST", "/upload", {**backend.headers(), "Transfer-Encoding": "chunked"}) + b"zz\r\n"
    )
    got, raw = await answers(
        router.http_port or 0, request_bytes("GET", "/first", backend.headers()) + broken
    )
    assert [a.status for a in got] == [200, 400], raw
    assert json.loads(got[1].body) == MALFORMED
    assert [s["raw_path"] for s in backend.seen] == ["/first"]
    assert backend.uploads == []


async def test_a_sandbox_on_aiohttp_takes_relayed_trailers(router: Router, backend: Backend) -> None:
    """The runtime's server (aiohttp) reads a chunked body that ends in relayed trailer fields."""
    headers = {**backend.headers(), "Transfer-Encoding": "chunked", "Connection": "close"}
    data = request_bytes("POST", "/upload", headers) + b"3\r\nabc\r\n0\r\nX-Digest: d1\r\n\r\n"
    resp = await raw_request(router.http_port or 0, data)
    assert resp.status == 200, resp
    assert json.loads(resp.body)["received"] == 3


async def test_a_response_trailer_that_never_ends_is_cut(router: Router) -> None:
    """The sandbox is untrusted: a trailer field that never ends is cut as an endless head is (at 1 MiB), and
    the client sees the truncation (no last chunk); it was buffered for as long as the sandbox sent it."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Pad: ")
        try:
            for _ in range(64):  # 4 MiB
                writer.write(b"p" * 65536)
                await writer.drain()
            await reader.read()
        except ConnectionError:
            pass
        writer.close()

    server, headers = await raw_backend(serve)
    try:
        _, raw = await answers(router.http_port or 0, request_bytes("GET", "/", headers))
    finally:
        server.close()
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n"), raw[:200]
    assert raw.endswith(b"2\r\nok\r\n"), raw[-200:]


async def test_a_body_read_with_its_head_does_not_count_as_head_bytes(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    """With a small `--max-request-header-bytes`, a read that carries a head and the start of its body (up to
    256 KiB) was refused 431 whole: the bytes of the read were counted as head bytes before parsing, and
    the chunked body's unframed-bytes count likewise (the latter since December 7). Only the reads before
    the current one are held against the cap; the head itself is measured exactly once parsed."""
    router = await start_router("--max-request-header-bytes=8192")
    size = 200_000
    chunked = request_bytes("POST", "/upload", {**backend.headers(), "Transfer-Encoding": "chunked"})
    got, raw = await answers(
        router.http_port or 0,
        request_bytes("POST", "/upload", backend.headers(), b"a" * size)
        + chunked
        + b"%x\r\n" % size
        + b"b" * size
        + b"\r\n0\r\n\r\n"
        + request_bytes("GET", "/last", {**backend.headers(), "Connection": "close"}),
    )
    assert [a.status for a in got] == [200, 200, 200], raw[:300]
    assert backend.uploads == [size, size]
