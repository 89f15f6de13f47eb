"""What the proxy listener hands its handler (`_server.Handler`): a parsed request head (`Request`) and its
streaming body (`RequestBody`).

A unit of its own because everything that serves a request reads it (the proxy, the exchange, access log,
tracing, outcome), while only the connection (`_server`, `_request_reader`) builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["NEVER_TRAILERS", "Request", "RequestBody", "trailer_allowed"]

NEVER_TRAILERS = frozenset(
    {
        # framing and hop-by-hop fields (RFC 9110 §6.5.1, §7.6.1)
        b"connection",
        b"content-length",
        b"expect",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        # what the router itself reads or writes in a head: a trailer copy would let a sandbox that merges
        # trailers into headers see a value the router never checked (routing, credentials, X-Forwarded-*)
        b"authorization",
        b"host",
        b"x-forwarded-for",
        b"x-forwarded-host",
        b"x-forwarded-proto",
    }
)
"""Trailer fields never relayed, either way (`x-sandbox-*` neither: see `trailer_allowed`)."""


def trailer_allowed(lname: bytes) -> bool:
    """Whether a trailer field (lower-case name) is relayed: not one of `NEVER_TRAILERS`, not `x-sandbox-*`."""
    return lname not in NEVER_TRAILERS and not lname.startswith(b"x-sandbox-")


_BODY_HIGH_WATER = 256 * 1024
"""Buffered request-body bytes (no upstream yet, or upstream write buffer full) before reading pauses."""


class RequestBody:
    """A request body streamed from the client to whoever attaches a sink (the upstream writer).

    Before a sink is attached, chunks are buffered (reading pauses above a bound). `chunked` bodies are
    re-framed by the sink owner; this object only carries payload bytes.
    """

    __slots__ = (
        "_buffer",
        "_buffered",
        "_conn",
        "_on_done",
        "_sink",
        "_whole",
        "done",
        "expected",
        "received",
    )

    def __init__(self, conn: Connection, expected: int | None) -> None:
        self._conn = conn
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._sink: Callable[[bytes], None] | None = None
        self._on_done: Callable[[], None] | None = None
        self._whole: bytes | None = None
        self.expected = expected
        """Content-Length, or None for chunked / no body."""
        self.received = 0
        self.done = False

    def feed(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self._sink is not None:
            self._sink(chunk)
            return
        self._buffer.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > _BODY_HIGH_WATER:
            self._conn.pause_reading_for_body()

    def finish(self) -> None:
        self.done = True
        if self._on_done is not None:
            self._on_done()

    def take_buffered(self) -> bytes:
        """Everything buffered so far (and forget it, unless it is the whole body: see `rewind`)."""
        data = b"".join(self._buffer) if len(self._buffer) != 1 else self._buffer[0]
        self._buffer.clear()
        self._buffered = 0
        if self.done and len(data) == self.received:
            self._whole = data
        return data

    def rewind(self) -> bool:
        """Buffer again the whole body a `take_buffered` returned, to send it on another connection.

        False when the body was streamed (it is no longer in hand, so the request cannot be sent again).
        """
        if self._whole is not None:
            self._buffer = [self._whole]
            self._buffered = len(self._whole)
            return True
        return self.received == 0 and self.done

    def attach(self, sink: Callable[[bytes], None], on_done: Callable[[], None]) -> None:
        """Stream further chunks into `sink` and call `on_done` at the end (after `take_buffered()`)."""
        self._sink = sink
        self._on_done = on_done
        self._conn.resume_reading_for_body()

    def detach(self) -> None:
        self._sink = None
        self._on_done = None


class Request:
    """One parsed request head plus its streaming body."""

    __slots__ = (
        "authorization",
        "body",
        "chunked",
        "connection_tokens",
        "content_length",
        "duplicates",
        "expect_continue",
        "headers",
        "host",
        "host_lines",
        "keep_alive",
        "method",
        "routing",
        "te_codings",
        "trailers",
        "upgrade",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.method = ""
        self.url = b""
        self.version = "1.1"
        self.headers: list[tuple[bytes, bytes, bytes]] = []
        """(lower-case name, name as sent, value) in wire order."""
        self.routing: dict[bytes, bytes] = {}
        self.duplicates: set[bytes] = set()
        self.host = b""
        self.host_lines = 0
        self.te_codings: tuple[bytes, ...] = ()
        self.authorization: bytes | None = None
        self.content_length: int | None = None
        self.chunked = False
        self.expect_continue = False
        self.connection_tokens: tuple[bytes, ...] = ()
        self.keep_alive = True
        self.upgrade = False
        self.body: RequestBody | None = None
        self.trailers: list[tuple[bytes, bytes]] = []
        """A chunked body's trailer fields (name as sent, value) that are relayed (`trailer_allowed`); they
        never count as headers (routing, authorization, framing)."""

    @property
    def path(self) -> bytes:
        """The path part of the request target (no query)."""
        q = self.url.find(b"?")
        return self.url if q < 0 else self.url[:q]
