"""Closing a client connection whose write buffer never drains ends in an abort after `--idle-timeout`.

`transport.close()` waits for the buffered bytes to be written; a client that stopped reading never lets
that happen, so the connection (descriptor, buffer) was kept for good. The transport here is a recorder:
the behaviour under test is the connection's bookkeeping (the integration tests in
tests/integration/router/test_nonreading_clients.py drive a real router).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sandbox.router._request import Request
from agent_sandbox.router._server import ClientConnection, ConnectionLimits

pytestmark = pytest.mark.unit


class _Transport:
    def __init__(self, buffered: int) -> None:
        self.buffered = buffered
        self.calls: list[str] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def close(self) -> None:
        self.calls.append("close")

    def abort(self) -> None:
        self.calls.append("abort")


class _Handler:
    async def handle(self, conn: ClientConnection, request: Request) -> None:
        return None


def _conn(buffered: int) -> tuple[ClientConnection, _Transport]:
    conn = ClientConnection(_Handler(), ConnectionLimits(idle_timeout=5.0), scheme="http")
    transport = _Transport(buffered)
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_a_close_with_answers_unflushed_is_an_abort_after_the_idle_timeout() -> None:
    conn, transport = _conn(buffered=40_000)
    now = asyncio.get_running_loop().time()
    conn.close()
    assert transport.calls == ["close"]
    assert now + 4 < conn.deadline < now + 6  # the sweeper checks it until connection_lost
    conn.expire()
    assert transport.calls == ["close", "abort"]


async def test_a_close_with_nothing_buffered_sets_no_deadline() -> None:
    conn, transport = _conn(buffered=0)
    conn.close()
    assert transport.calls == ["close"]
    assert conn.deadline == float("inf")


async def test_the_flush_deadline_ends_with_the_connection() -> None:
    conn, transport = _conn(buffered=40_000)
    conn.close()
    conn.connection_lost(None)
    assert conn.deadline == float("inf")
    conn.expire()
    assert transport.calls == ["close"]


async def test_a_second_close_or_abort_keeps_the_flush_deadline() -> None:
    conn, transport = _conn(buffered=40_000)
    conn.close()
    deadline = conn.deadline
    conn.close()
    conn.abort()
    assert conn.deadline == deadline
    conn.expire()
    assert transport.calls == ["close", "abort"]
