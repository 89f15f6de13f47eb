"""The write gate at the socket: pooled API connections that refuse a write once leadership lapsed.

`RestClient` asks its gate before a write; these two ask it again at the last moments a frozen process could
stop at - once the write's pooled connection is in hand, and at each write into the socket - so a write that
passed the first check before a freeze (SIGSTOP, a long pause) never goes out after a hand-over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

__all__ = ["GatedConnector", "GatedTransport"]


class GatedConnector(aiohttp.TCPConnector):
    """A TCP connector that asks the client's write gate once a write's connection is in hand.

    Waiting for a free pooled connection or a TLS handshake can span a freeze (SIGSTOP, a long pause):
    a write that passed the gate before it must not go out after leadership lapsed. Acquiring the
    connection is the last await before the request's bytes are written.
    """

    def __init__(self, check_write: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._check_write = check_write

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[aiohttp.tracing.Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's signature
    ) -> aiohttp.connector.Connection:
        conn = await super().connect(req, traces, timeout)
        try:
            self._check_write(req.method)
        except BaseException:
            conn.release()  # nothing was written on it: back to the pool
            raise
        protocol = conn.protocol
        transport: Any = protocol.transport if protocol is not None else None
        if protocol is not None and transport is not None:
            if not isinstance(transport, GatedTransport):
                transport = GatedTransport(transport, self._check_write)
                protocol.transport = transport
            transport.method = req.method  # every request on a pooled connection passes through here
        return conn


class GatedTransport:
    """A pooled API connection's transport that asks the write gate again at each socket write.

    The check in `connect` still leaves the Python code that serialises the request (an event-loop turn)
    between the gate and the socket: a process frozen there sent its write after a hand-over (CI, the
    frozen-leader test). Here what is left is the call into the socket itself. A refusal aborts the
    connection, so a request partly on the wire is never completed (the server discards it).
    """

    def __init__(self, transport: asyncio.Transport, check_write: Callable[[str], None]) -> None:
        self._transport = transport
        self._check_write = check_write
        self.method = "GET"

    def _gate(self) -> None:
        try:
            self._check_write(self.method)
        except BaseException:
            self._transport.abort()
            raise

    def write(self, data: Any) -> None:
        self._gate()
        self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        self._gate()
        self._transport.writelines(chunks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
