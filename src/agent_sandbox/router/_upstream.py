"""Upstream (router -> sandbox) HTTP/1.1 connections and the keep-alive pool.

Owns: dialling a sandbox address (TCP, `TCP_NODELAY`, dial timeout), parsing its responses with
`httptools` (llhttp) and handing head/body/end events to the exchange that currently owns the connection,
write-side flow control signals, and the idle pool (LIFO so hot connections stay hot; closed after 90 s idle
as Go's transport). Go keeps at most 16 idle connections per host; at 50 concurrent requests to one
sandbox that closes and re-dials connections all the time, so we keep up to 256 per host (1,024 in total;
docs/design/router-performance.md).

Does not own: what a response means (`_exchange.Exchange` decides) or retries (`_proxy`).

Failure modes: a connection that receives bytes while idle, or whose peer closes, leaves the pool; a
parse error or close during an exchange is reported to the exchange (`ResponseSink.upstream_failed`),
which knows whether any response byte had reached the client.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Protocol, cast

import httptools

__all__ = ["ResponseSink", "UpstreamConnection", "UpstreamPool"]

log = logging.getLogger("agent_sandbox.router.upstream")

_NO_BODY_STATUS = frozenset({204, 304})


class ResponseSink(Protocol):
    """The exchange currently using an upstream connection."""

    def response_head(self, status: int, headers: list[tuple[bytes, bytes]], streamed: bool) -> None:
        """`streamed`: a body without Content-Length follows (chunked, or until the server closes)."""

    def response_body(self, chunk: bytes) -> None: ...

    def response_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        """A chunked response's trailer fields (name, value), just before `response_complete`."""

    def response_complete(self, reusable: bool) -> None: ...

    def response_upgraded(self, tail: bytes) -> None: ...

    def flush(self) -> None:
        """Called after each read: write out what the read produced."""

    def upstream_failed(self, reason: str, error: BaseException | None) -> None: ...

    def upstream_pause_writing(self) -> None: ...

    def upstream_resume_writing(self) -> None: ...


#: Most bytes a sandbox may send before its response head is complete (status line, headers, interim
#: responses). The sandbox is untrusted: without a bound, one that never ends its head would have the router
#: buffer headers until the response-header timeout, at the speed of the network. Go's http.Transport
#: refuses heads over its own limit the same way (502).
MAX_RESPONSE_HEAD_BYTES = 1 << 20


class ResponseHeadTooLarge(Exception):
    """The sandbox's response head went past `MAX_RESPONSE_HEAD_BYTES`."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to a sandbox."""

    def __init__(
        self, pool: UpstreamPool, key: tuple[str, int], *, server_speaks_first: bool = False
    ) -> None:
        self.pool = pool
        self.key = key
        self.early: bytearray | None = bytearray() if server_speaks_first else None
        """Bytes the server sent before anyone took the connection (h2c: the server's SETTINGS), kept
        for the tunnel; None for HTTP/1.1, where an unsolicited byte makes the connection unusable."""
        self.transport: asyncio.Transport | None = None
        self.sink: ResponseSink | None = None
        self.closed = False
        self.reused = False
        """True once the connection has carried a previous exchange (stale keep-alive possible)."""
        self.idle_since = 0.0
        self.tunnel: Callable[[bytes], None] | None = None
        """Set once the connection is upgraded: raw bytes go here instead of the parser."""
        self.on_lost: Callable[[BaseException | None], None] | None = None
        self.on_write_pause: Callable[[bool], None] | None = None
        """Used once upgraded (no sink any more): write buffer full/drained."""
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._trailers: list[tuple[bytes, bytes]] = []
        self._trailer_bytes = 0
        self._unframed = 0
        """Bytes read since the body's last payload byte (chunk-size lines, trailers; httptools buffers a
        field until it ends): bounded as the head is."""
        self._interim = False
        self._head_only = False
        self._reset_parser = False
        self._eof_body = False
        self._head_seen = False
        self._head_bytes = 0
        self._status = 0

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel(data)
            return
        sink = self.sink
        if sink is None:
            if self.early is not None:
                # A server that speaks first (HTTP/2 sends SETTINGS on accept) may do so before the
                # dialling coroutine resumes and attaches its tunnel: keep the bytes for it.
                self.early += data
                return
            # A server speaking out of turn on an idle connection: it cannot be reused safely.
            self.close()
            return
        if not self._head_seen:
            # Every earlier read of this response was head only (else the head would be complete), so this
            # is exact up to the current read, which may also carry the body's start.
            if self._head_bytes > MAX_RESPONSE_HEAD_BYTES:
                self._refuse_oversized(sink, "head")
                return
            self._head_bytes += len(data)
        else:
            self._unframed += len(data)
            if self._unframed > MAX_RESPONSE_HEAD_BYTES:
                self._refuse_oversized(sink, "trailers")
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            offset = exc.args[0]
            self.sink = None
            sink.response_upgraded(data[offset:])
            return
        except httptools.HttpParserError as exc:
            self.sink = None
            self.close()
            # A complete response followed by bytes that do not parse (a body on a 204, say): the response
            # is relayed (flush) and the connection is not reused; a broken one ends the exchange.
            sink.flush()
            sink.upstream_failed("other", exc)
            return
        sink.flush()

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost reports it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.on_lost is not None:
            self.on_lost(exc)
            return
        sink, self.sink = self.sink, None
        if sink is None:
            return
        if self._head_seen and self._eof_body:
            # A response without Content-Length or chunking ends when the server closes; nothing else
            # flushes here (data_received does after a read), so the end of the relayed body is sent now.
            sink.response_complete(False)
            sink.flush()
        else:
            sink.upstream_failed("eof", exc)

    def pause_writing(self) -> None:
        if self.sink is not None:
            self.sink.upstream_pause_writing()
        elif self.on_write_pause is not None:
            self.on_write_pause(True)

    def resume_writing(self) -> None:
        if self.sink is not None:
            self.sink.upstream_resume_writing()
        elif self.on_write_pause is not None:
            self.on_write_pause(False)

    # ------------------------------------------------------------------ exchange API

    def _refuse_oversized(self, sink: ResponseSink, part: str) -> None:
        """Give up a response whose head or trailer section passed the cap: the connection cannot be reused."""
        self.sink = None
        self.close()
        sink.upstream_failed(
            "other", ResponseHeadTooLarge(f"response {part} over {MAX_RESPONSE_HEAD_BYTES} bytes")
        )

    def begin(self, sink: ResponseSink, *, head_only: bool) -> None:
        """Hand the connection to an exchange; `head_only` for HEAD requests (no response body)."""
        if self._reset_parser:
            self._parser = httptools.HttpResponseParser(self)
            self._reset_parser = False
        self.sink = sink
        self._head_only = head_only
        self._head_seen = False
        self._head_bytes = 0
        self._unframed = 0
        self._eof_body = False

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once (used when the exchange is abandoned mid-flight)."""
        self.sink = None
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self._headers = []
        self._trailers = []
        self._trailer_bytes = 0
        self._interim = False
        if self.sink is None:
            # A response nobody asked for, in the same read as the last one: the sandbox is not speaking
            # HTTP in turn, so nothing more read from this connection can be trusted to answer a request.
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_seen:
            # A chunked body's trailer section (httptools reports its fields as headers): for the exchange,
            # bounded as a head is (the sandbox is untrusted).
            self._trailer_bytes += len(name) + len(value) + 4
            if self._trailer_bytes > MAX_RESPONSE_HEAD_BYTES:
                raise ResponseHeadTooLarge(f"response trailers over {MAX_RESPONSE_HEAD_BYTES} bytes")
            self._trailers.append((name, value.strip(b" \t")))
            return
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._status = self._parser.get_status_code()
        sink = self.sink
        if sink is None:
            return
        if 100 <= status < 200 and status != 101:
            # Interim responses (100 Continue, 103 Early Hints) are absorbed: the router answers the
            # client's Expect itself and never forwards interim heads.
            self._interim = True
            return
        self._head_seen = True
        self._unframed = 0  # counted from the next read: this one's bytes were counted as the head's
        streamed = eof_body = False
        if not self._head_only and status not in _NO_BODY_STATUS and status != 101:
            has_length = chunked = False
            for name, value in self._headers:
                lname = name.lower()
                if lname == b"content-length":
                    has_length = True
                elif lname == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            streamed = chunked or not has_length
            eof_body = not chunked and not has_length
        self._eof_body = eof_body
        sink.response_head(status, self._headers, streamed)
        if self._head_only and self.sink is sink:
            # llhttp would wait for a HEAD response's Content-Length worth of body: finish here and use a
            # fresh parser for the next exchange on this connection.
            self._reset_parser = True
            self.sink = None
            sink.response_complete(self._parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        self._unframed = 0
        if self.sink is not None:
            self.sink.response_body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._status == 101:
            return  # feed_data raises HttpParserUpgrade next; data_received hands over the tail
        sink, self.sink = self.sink, None
        if sink is not None:
            if self._trailers:
                sink.response_trailers(self._trailers)
            sink.response_complete(self._parser.should_keep_alive() and not self._eof_body)


def _closed_unread(conn: UpstreamConnection) -> bool:
    """The idle connection's peer closed it, reset it or sent bytes, and the loop has not read that yet.

    A non-blocking MSG_PEEK on the socket: one syscall per reuse. uvloop's transports hand out a
    pseudo-socket without recv, so the descriptor is wrapped for the call and released (never closed).
    """
    transport = conn.transport
    raw = transport.get_extra_info("socket") if transport is not None else None
    if raw is None:
        return False
    try:
        # SOCK_NONBLOCK: a timeout of 0 for the wrapper without a syscall (a process-wide default timeout
        # would otherwise have recv wait for data).
        probe = socket.socket(raw.family, raw.type | socket.SOCK_NONBLOCK, raw.proto, raw.fileno())
    except OSError:
        return True  # the descriptor is gone
    try:
        probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False  # open, nothing pending: usable
    except OSError:
        return True  # reset
    finally:
        probe.detach()
    return True  # b"": the peer's FIN; a byte: the sandbox speaking out of turn (unusable either way)


class UpstreamPool:
    """Idle keep-alive connections per (host, port)."""

    def __init__(
        self,
        *,
        max_idle_per_host: int = 256,
        max_idle_total: int = 1024,
        idle_timeout: float = 90.0,
        dial_timeout: float = 30.0,
    ) -> None:
        self.max_idle_per_host = max_idle_per_host
        self.max_idle_total = max_idle_total
        self.idle_timeout = idle_timeout
        self.dial_timeout = dial_timeout
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        self._total = 0
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def idle_count(self) -> int:
        return self._total

    def take(self, key: tuple[str, int]) -> UpstreamConnection | None:
        """An idle connection to `key` (most recently used first), or None."""
        conns = self._idle.get(key)
        while conns:
            conn = conns.pop()
            self._total -= 1
            if not conns:
                del self._idle[key]
            if conn.closed:
                continue
            if _closed_unread(conn):
                # The sandbox closed it (its keep-alive timeout) and the loop has not read that yet: a request
                # sent on it would meet the close, and one that may not run twice is not sent again
                # (`_exchange.may_resend`). Go's transport narrows the same race with its read loop's peek.
                conn.close()
                continue
            return conn
        return None

    async def dial(
        self, host: str, port: int, *, deadline: float, server_speaks_first: bool = False
    ) -> UpstreamConnection:
        """Open a new connection (by the loop-time `deadline` and within the dial timeout).

        `server_speaks_first`: for a tunnel whose protocol lets the server send before the client's
        first request is relayed (h2c); what arrives before the tunnel is attached waits in `early`.

        Raises:
            OSError: refused, unreachable, ...
            TimeoutError: no connection in time.
        """
        loop = asyncio.get_running_loop()
        key = (host, port)
        async with asyncio.timeout_at(min(deadline, loop.time() + self.dial_timeout)):
            _, conn = await loop.create_connection(
                lambda: UpstreamConnection(self, key, server_speaks_first=server_speaks_first), host, port
            )
        return conn

    def put(self, conn: UpstreamConnection) -> None:
        """Return a connection after a complete exchange (closed if the pool is full)."""
        if conn.closed:
            return
        conns = self._idle.setdefault(conn.key, [])
        if len(conns) >= self.max_idle_per_host or self._total >= self.max_idle_total:
            if not conns:
                del self._idle[conn.key]
            conn.close()
            return
        conn.reused = True
        conn.sink = None
        conn.idle_since = time.monotonic()
        transport = conn.transport
        if transport is not None and not transport.is_reading():
            # Paused for a slow client when the response's last bytes arrived (the client's buffer filled
            # with them): the next request's answer would never be read (a 504 after the header timeout),
            # and an idle connection must read to notice its peer closing.
            transport.resume_reading()
        conns.append(conn)
        self._total += 1
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self.idle_timeout / 3, self._sweep)

    def forget(self, conn: UpstreamConnection) -> None:
        """Remove a closed connection from the idle lists (called by the connection itself)."""
        conns = self._idle.get(conn.key)
        if conns and conn in conns:
            conns.remove(conn)
            self._total -= 1
            if not conns:
                del self._idle[conn.key]

    def _sweep(self) -> None:
        self._sweeper = None
        cutoff = time.monotonic() - self.idle_timeout
        for conns in list(self._idle.values()):
            for conn in [c for c in conns if c.idle_since < cutoff]:
                conn.close()  # connection_lost -> forget()
        if self._total:
            self._sweeper = asyncio.get_running_loop().call_later(self.idle_timeout / 3, self._sweep)

    def close_all(self) -> None:
        for conns in list(self._idle.values()):
            for conn in list(conns):
                conn.close()
        self._idle.clear()
        self._total = 0
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
