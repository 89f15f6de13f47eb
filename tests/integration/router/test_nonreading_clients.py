"""A client that pipelines requests and never reads its answers is let go of after `--idle-timeout`.

Closing a connection whose write buffer the client never drains does not end it (`transport.close()` waits
for the flush, and the kernel probes a zero window for good): it is aborted instead, so its descriptor and
buffered answers are freed. Checked with the real router process (uvloop) and in-process (asyncio's loop).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_sandbox.router import Router

from .conftest import Backend, RouterProcess, request_bytes

pytestmark = pytest.mark.integration

_PIPELINED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def _stuff(port: int) -> socket.socket:
    """Connect, pipeline requests until the router stops reading them, and return the socket unread."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.settimeout(0.5)
    blob = _PIPELINED * (65536 // len(_PIPELINED))
    try:
        while True:
            s.send(blob)
    except TimeoutError:
        pass
    return s


def _server_side_open(router_port: int, client_port: int) -> bool:
    """The router still holds its end of the connection from `client_port` (any TCP state)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote = line.split()[1:3]
        if int(local.split(":")[1], 16) == router_port and int(remote.split(":")[1], 16) == client_port:
            return True
    return False


def test_a_nonreading_pipelining_client_is_dropped_after_the_idle_timeout_uvloop(
    router_process: Callable[..., RouterProcess],
) -> None:
    router = router_process("--idle-timeout=3s")
    s = _stuff(router.port)
    try:
        client_port = s.getsockname()[1]
        assert _server_side_open(router.port, client_port)
        deadline = time.monotonic() + 10
        while _server_side_open(router.port, client_port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _server_side_open(router.port, client_port), (
            "the connection of a client that reads nothing outlived --idle-timeout"
        )
    finally:
        s.close()


async def test_a_nonreading_pipelining_client_is_dropped_after_the_idle_timeout(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    router = await start_router("--idle-timeout=3s")
    s = await asyncio.to_thread(_stuff, router.http_port or 0)
    try:
        assert len(router.connections) == 1
        conn = next(iter(router.connections))
        async with asyncio.timeout(10):
            while router.connections:  # noqa: ASYNC110 - the router has no event for it
                await asyncio.sleep(0.1)
        assert conn.closed
    finally:
        s.close()


async def test_a_head_begun_during_the_previous_answer_is_held_to_the_header_timeout(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    """A request head started while the previous request was being served, and never finished: once that
    answer is out the header clock runs (as Go's server reads the next request under its deadline). Until
    December 6 no deadline was armed at all and the connection was held for good."""
    router = await start_router("--read-header-timeout=1s", "--idle-timeout=60s")
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    try:
        writer.write(
            request_bytes("GET", "/sleep/0.5", backend.headers()) + b"GET /x HTTP/1.1\r\nHost: r\r\n"
        )
        data = b""
        async with asyncio.timeout(6):
            while chunk := await reader.read(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200")
        assert b"HTTP/1.1 408" in data
    finally:
        writer.close()
