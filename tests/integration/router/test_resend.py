"""A request the sandbox read and then dropped unanswered on a pooled keep-alive connection: sent again only
if it may run twice (Go's net/http Transport rule, upstream's router's: `_exchange.may_resend`).

Until December 7 the router sent any such request again, up to 64 KiB: a POST /execute whose runtime was
killed while running the command ran it twice once the runtime was back, and the SDK saw a success.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_sandbox.router import Router

from .conftest import exchange, raw_backend, request_bytes


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One whole request (Content-Length framing): its request line and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return head.split(b"\r\n", 1)[0], body


@pytest.mark.parametrize(
    ("method", "extra", "resent"),
    [
        ("POST", {}, False),
        ("PUT", {}, False),
        ("DELETE", {}, False),
        ("GET", {}, True),
        ("POST", {"X-Idempotency-Key": "k1"}, True),
    ],
)
async def test_a_request_read_then_dropped_on_a_pooled_connection(
    router: Router, method: str, extra: dict[str, str], resent: bool
) -> None:
    """The sandbox answers a first request, then reads the second one whole on the same (pooled) connection
    and closes it without a byte of answer - a runtime killed mid-command, or its keep-alive close racing
    the request. A POST (PUT, DELETE) gets the 502 and reached the sandbox once; a GET, or a request with
    an idempotency key, is sent again on a fresh connection and answered."""
    seen: list[tuple[int, bytes, bytes]] = []
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        try:
            while True:
                line, body = await _read_request(reader)
                seen.append((number, line, body))
                if number == 1 and len(seen) == 2:
                    break  # read whole, then dropped unanswered
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server, headers = await raw_backend(serve)
    port = router.http_port or 0
    try:
        warm = await exchange(port, request_bytes("GET", "/warm", headers))
        assert warm.status == 200, warm  # the connection is in the router's pool now
        body = b"echo charged >> side.txt" if method != "GET" else b""
        answer = await exchange(port, request_bytes(method, "/execute", {**headers, **extra}, body))
        second = [(n, line) for n, line, _ in seen[1:]]
        if resent:
            assert (answer.status, answer.body) == (200, b"ok"), answer
            # once on the pooled connection, once more on a fresh one, with its body both times
            line = f"{method} /execute HTTP/1.1".encode()
            assert second == [(1, line), (2, line)]
            assert [b for _, _, b in seen[1:]] == [body, body]
        else:
            assert answer.status == 502, answer
            assert json.loads(answer.body) == {"detail": "Could not connect to the backend sandbox: sb"}
            assert second == [(1, f"{method} /execute HTTP/1.1".encode())]  # exactly once
            assert connections == 1
    finally:
        server.close()


async def test_without_the_lifecycle_a_runtimes_not_started_answer_is_relayed_as_it_is(
    router: Router,
) -> None:
    """A draining runtime's `503` with `X-Sandbox-Not-Started` is held and sent again only by a router running
    `--sandbox-lifecycle` (tests/integration/lifecycle/test_resume.py); without it the router relays it, as
    upstream's relays any answer, and the request reached the sandbox once."""
    seen: list[bytes] = []
    refusal = b'{"message":"runtime is shutting down: the command was not started"}'

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _ = await _read_request(reader)
        seen.append(line)
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nX-Sandbox-Not-Started: shutting down\r\nRetry-After: 1\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b"
            % (len(refusal), refusal)
        )
        await writer.drain()
        writer.close()

    server, headers = await raw_backend(serve)
    try:
        answer = await exchange(router.http_port or 0, request_bytes("POST", "/execute", headers, b"{}"))
        assert (answer.status, answer.body) == (503, refusal), answer
        assert answer.headers.get("x-sandbox-not-started") == "shutting down", answer
        assert seen == [b"POST /execute HTTP/1.1"]
    finally:
        server.close()
