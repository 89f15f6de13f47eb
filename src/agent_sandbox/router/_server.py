"""The proxy listener's HTTP/1.1 server side: one `ClientConnection` per accepted socket.

Owns: parsing requests with `httptools` (llhttp: strict framing, so CL+TE smuggling, bare CR/LF and
obs-fold are refused), the request-level limits (header bytes -> 431, read-header timeout -> 408 for
slowloris clients, keep-alive idle timeout), pipelining (requests are answered strictly in order; later
ones wait with their bodies buffered up to a bound), request-body streaming with flow control
(`RequestBody`), upgrade hand-off (the raw bytes after an upgrade request), and connection-level
keep-alive/close bookkeeping. Each request is handed to the `Handler` as a task.

Does not own: what is done with a request (`_proxy.Proxy`), TLS (the listener's SSL context).

Failure modes: malformed HTTP -> 400 JSON and close; a client that disappears mid-request cancels its
handler (which aborts the upstream exchange).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from ._fdlimit import EXHAUSTED_DETAIL
from ._responses import json_response

__all__ = [
    "H2C_PREFACE",
    "ClientConnection",
    "ConnectionLimits",
    "DeadlineSweeper",
    "Handler",
    "Request",
    "RequestBody",
]

log = logging.getLogger("agent_sandbox.router.server")

_BODY_HIGH_WATER = 256 * 1024
"""Buffered request-body bytes (no upstream yet, or upstream write buffer full) before reading pauses."""
_HEAD_SLACK = 64 * 1024
_DISCARD_LIMIT = 256 * 1024
"""Request-body bytes still read (and dropped) after the response so the connection stays usable (Go's
server reads up to the same 256 KiB); past it the connection closes."""


#: How an h2c (prior knowledge) connection starts: the HTTP/2 client preface (RFC 9113 §3.4).
H2C_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Handler(Protocol):
    async def handle(self, conn: ClientConnection, request: Request) -> None: ...


class ConnectionLimits:
    """Per-connection limits shared by every connection of a listener."""

    __slots__ = (
        "fd_guard",
        "h2c",
        "idle_timeout",
        "max_body_bytes",
        "max_header_bytes",
        "read_header_timeout",
    )

    def __init__(
        self,
        *,
        max_header_bytes: int = 1 << 20,
        max_body_bytes: int = 0,
        read_header_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        h2c: Callable[[ClientConnection, bytes], None] | None = None,
        fd_guard: Callable[[int], bool] | None = None,
    ) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.read_header_timeout = read_header_timeout
        self.idle_timeout = idle_timeout
        self.h2c = h2c
        """Takes over a connection that opens with the HTTP/2 preface (None: h2c refused)."""
        self.fd_guard = fd_guard
        """Called with an accepted socket's descriptor number: True when the router is nearly out of
        descriptors (`_fdlimit.FdReport`), and the client is answered 503 instead of served."""


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

    def __init__(self, conn: ClientConnection, expected: int | None) -> None:
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

    @property
    def path(self) -> bytes:
        """The path part of the request target (no query)."""
        q = self.url.find(b"?")
        return self.url if q < 0 else self.url[:q]


class ClientConnection(asyncio.Protocol):
    """One client connection on the proxy listener."""

    def __init__(
        self,
        handler: Handler,
        limits: ConnectionLimits,
        *,
        scheme: str,
        registry: set[ClientConnection] | None = None,
        client_cert_required: bool = False,
    ) -> None:
        self.handler = handler
        self._client_cert_required = client_cert_required
        self._registry = registry
        self.limits = limits
        self.scheme = scheme
        self.transport: asyncio.Transport | None = None
        self.client_ip = ""
        self.closed = False
        self.draining = False
        self.write_paused = False
        self.on_write_pause: Callable[[bool], None] | None = None
        """Set by the active exchange: called with True/False when the client write buffer fills/drains."""
        self.tunnel: Callable[[bytes], None] | None = None
        """Set once upgraded: raw client bytes go here."""
        self.on_lost: Callable[[], None] | None = None
        self.upgrade_tail = b""
        self._parser = httptools.HttpRequestParser(self)
        self._priming = False
        """A fresh parser is being fed a stand-in request head (`_parse_body_after_head`): callbacks ignored."""
        self._body_skipped: Request | None = None
        """An upgrade offer with a body whose body the parser skipped (it hands over right after the head)."""
        self._current: Request | None = None
        self._active: Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: deque[Request] = deque()
        self._head_bytes = 0
        self._in_head = False
        self.deadline = math.inf
        """Loop time at which `_on_deadline` fires (checked by the listener's `DeadlineSweeper`)."""
        self._on_deadline: Callable[[], None] | None = None
        self._reading_paused_for: set[str] = set()
        self._next_waits_for_write = False
        """A pipelined request is due but the client's write buffer is full: it starts on `resume_writing`."""
        self._first_data = True
        self._preface_start = b""
        self._failed = False
        self._lingering = False
        self.failed_status = 0
        self.response_started = False
        """The active request's response head has been written (errors can no longer be sent)."""
        self.handler_started = False
        """The active request's handler has begun (set by it): `fail` cancels it only then."""

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.client_ip = peer[0] if isinstance(peer, tuple) else ""
        if self._registry is not None:
            self._registry.add(self)
        if self._client_cert_required:
            tls = transport.get_extra_info("ssl_object")
            self._client_cert_required = tls is None or not tls.getpeercert()
        self._arm(self.limits.read_header_timeout, self._header_timeout)
        guard = self.limits.fd_guard
        if guard is not None:
            sock = transport.get_extra_info("socket")
            fd = sock.fileno() if sock is not None else -1
            if fd >= 0 and guard(fd):
                # Answered rather than served (the last descriptors are for what is being served already),
                # and answered rather than reset, as libuv does once none is left (`_fdlimit`).
                self.fail(503, EXHAUSTED_DETAIL, extra=b"Retry-After: 1\r\n")

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel(data)
            return
        if self._failed:
            return
        if self._client_cert_required:  # `--mtls-mode=required` and none presented (see _tls.build_context)
            self.fail(400, "A client certificate is required.")
            return
        if self._first_data:
            if self.limits.h2c is not None:
                # The h2c preface may arrive over several reads (a client or a TCP relay that writes it in
                # pieces): a first read that is only the start of it waits for the rest (the header timeout,
                # armed at accept, bounds the wait).
                data = self._preface_start + data
                if len(data) < len(H2C_PREFACE) and H2C_PREFACE.startswith(data):
                    self._preface_start = data
                    return
                self._preface_start = b""
            self._first_data = False
            if data.startswith(b"PRI * HTTP/2.0") and self.limits.h2c is not None:
                self._cancel_timer()
                self.limits.h2c(self, data)
                return
        if (
            not self._in_head
            and self._active is None
            and not self._pending
            and self._on_deadline != self._header_timeout
        ):
            # First byte of a new request on an idle keep-alive connection: the header clock starts. On a new
            # connection it runs from the accept already, as Go's does (restarted here, a client could take
            # nearly twice --read-header-timeout, until December 6).
            self._arm(self.limits.read_header_timeout, self._header_timeout)
        if self._in_head or self._current is None:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes + _HEAD_SLACK:
                self.fail(431, "Request header fields too large.")
                return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self._body_skipped is not None:
                self._parse_body_after_head(self._body_skipped, data[exc.args[0] :])
                return
            self.upgrade_tail += data[exc.args[0] :]
            if self.transport is not None:
                self.transport.pause_reading()
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _TooLarge):
                self.fail(431, "Request header fields too large.")
            elif isinstance(cause, _BodyTooLarge):
                self.fail(413, "Request body too large.")
            elif isinstance(cause, _Malformed):
                self.fail(400, "Malformed HTTP request.")
            elif isinstance(cause, _UnsupportedCoding):
                self.fail(501, "Unsupported transfer encoding.")
            elif not self._failed:
                log.error("request parser callback failed", exc_info=cause)
                self.fail(400, "Malformed HTTP request.")
        except httptools.HttpParserError:
            self.fail(400, "Malformed HTTP request.")

    def _parse_body_after_head(self, req: Request, rest: bytes) -> None:
        """An upgrade offer that carries a body (`curl --http2` POSTs, `Upgrade: h2c`): llhttp hands the
        connection over right after the head, so the body would be read as the new protocol and the request
        forwarded without it (the sandbox then waits for a body that never comes). The offer is declined
        instead, as a server may (RFC 9110 §7.8; `Upgrade` is hop-by-hop, so it is not forwarded): a fresh
        parser, primed with a stand-in head of the same framing, reads the body and what follows as HTTP/1.1.
        """
        self._body_skipped = None
        self._parser = httptools.HttpRequestParser(self)
        framing = (
            b"Transfer-Encoding: chunked"
            if req.chunked
            else b"Content-Length: %d" % (req.content_length or 0)
        )
        self._priming = True
        try:
            self._parser.feed_data(b"POST / HTTP/1.1\r\n" + framing + b"\r\n\r\n")
        finally:
            self._priming = False
        if rest:
            self._feed(rest)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._registry is not None:
            self._registry.discard(self)
        self._cancel_timer()
        if self.on_lost is not None:
            self.on_lost()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._pending.clear()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.on_write_pause is not None:
            self.on_write_pause(True)
        # The client does not read what it is sent: read no more of its requests either (pipelined ones the
        # router answers itself - a 400, /healthz - would otherwise each add an answer to the write buffer:
        # a client that sent and never read grew the router by 800 MB until December 6; Go's server writes
        # a response before it reads the next request). Not while a request body is still coming in (the
        # exchange relaying it applies its own flow control), once upgraded (the tunnel does), or while
        # lingering (input is drained then, so the close does not reset the answer away).
        if self.tunnel is None and not self._lingering and not self._body_incoming():
            self.pause_reading_for_body("write")

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.on_write_pause is not None:
            self.on_write_pause(False)
        if "write" in self._reading_paused_for:
            self.resume_reading_for_body("write")
            if self._active is None and not self._pending and not self.closed and not self._lingering:
                self._await_next()  # a head begun meanwhile gets its header clock from now
        if self._next_waits_for_write:
            self._next_waits_for_write = False
            if self._active is None:
                self._cancel_timer()
                self._serve_next()

    def _body_incoming(self) -> bool:
        active = self._active
        return active is not None and active.body is not None and not active.body.done

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        if self._priming:
            return
        self._current = Request()
        self._in_head = True
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        if self._priming:
            return
        req = self._current
        assert req is not None
        req.url += url
        if len(req.url) > self.limits.max_header_bytes:
            raise _TooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._priming:
            return
        req = self._current
        assert req is not None
        lname = name.lower()
        # Whitespace around a field value is not part of it (RFC 9110 §5.5; Go's textproto trims it): kept,
        # `Content-Length: 41 ` read as no length forwarded the head without its body, and the sandbox waited
        # 30 s for it (until December 6).
        value = value.strip(b" \t")
        req.headers.append((lname, name, value))
        if lname.startswith(b"x-sandbox-"):
            if lname in req.routing:
                req.duplicates.add(lname)
            else:
                req.routing[lname] = value
        elif lname == b"host":
            req.host = value
            req.host_lines += 1
        elif lname == b"authorization" and req.authorization is None:
            req.authorization = value  # the first, as upstream's Header.Get (the last won until December 6)
        elif lname == b"content-length":
            if not value.isdigit() or len(value) > 18:  # past 10^18 bytes: not a length anybody sends
                raise _Malformed
            req.content_length = int(value)
        elif lname == b"transfer-encoding":
            req.te_codings += tuple(t.strip().lower() for t in value.split(b",") if t.strip())
            req.chunked = req.te_codings[-1:] == (b"chunked",)
        elif lname == b"expect":
            req.expect_continue = value.lower() == b"100-continue"
        elif lname == b"connection":
            req.connection_tokens += tuple(t.strip().lower() for t in value.split(b",") if t.strip())

    def on_headers_complete(self) -> None:
        if self._priming:
            return
        req = self._current
        assert req is not None
        size = len(req.url) + sum(len(n) + len(v) + 4 for _, n, v in req.headers)
        if size > self.limits.max_header_bytes:
            raise _TooLarge
        self._in_head = False
        parser = self._parser
        req.method = parser.get_method().decode("ascii", "replace")
        req.version = parser.get_http_version()
        if req.version not in ("1.1", "1.0"):
            raise _Malformed  # HTTP/0.9 request lines (no version) carry no headers we could trust
        if req.host_lines > 1 or (req.version == "1.1" and not req.host_lines):
            raise _Malformed  # as Go's server: "missing required Host header", "too many Host headers"
        if req.te_codings and req.te_codings != (b"chunked",):
            # a coding before `chunked` (gzip, ...) would be dropped on the way: the sandbox would read
            # compressed bytes as the body (Go answers 501 too)
            raise _UnsupportedCoding
        req.keep_alive = parser.should_keep_alive()
        req.upgrade = parser.should_upgrade()
        if req.upgrade and (req.chunked or req.content_length):
            # The parser will skip this body (_parse_body_after_head): the offer is declined.
            req.upgrade = False
            self._body_skipped = req
        req.body = RequestBody(self, req.content_length if not req.chunked else None)
        if self._active is None:
            self._cancel_timer()
            self._start(req)
        else:
            self._pending.append(req)
            self.pause_reading_for_body("pipeline")

    def on_body(self, body: bytes) -> None:
        req = self._current
        if req is not None and req.body is not None:
            limit = self.limits.max_body_bytes
            if limit and req.body.received + len(body) > limit:
                raise _BodyTooLarge
            req.body.feed(body)

    def on_message_complete(self) -> None:
        req = self._current
        if req is not None and req is self._body_skipped:
            return  # the head only: its body follows the parser's hand-over
        if req is not None and req.body is not None:
            req.body.finish()
        self._current = None

    # ------------------------------------------------------------------ request lifecycle

    def _start(self, req: Request) -> None:
        self._active = req
        self.handler_started = False
        self._task = asyncio.get_running_loop().create_task(self.handler.handle(self, req))

    def finish_request(self, *, keep_alive: bool) -> None:
        """The handler wrote the whole response: close, or serve the next pipelined/keep-alive request."""
        req = self._active
        self._active = None
        self._task = None
        self.on_write_pause = None
        self.response_started = False
        if self.closed:
            return
        body = req.body if req is not None else None
        body_left = body is not None and not body.done
        if not keep_alive or self.draining or (req is not None and req.upgrade):
            if body_left:
                self._linger_close()  # a plain close with input unread resets the response away
            else:
                self.close()
            return
        if body is not None and body_left:
            self._discard_rest(body)
            return
        self._serve_next()

    def _discard_rest(self, body: RequestBody) -> None:
        """The response went out before the client finished its body (the sandbox answered at a multipart's
        closing boundary, ahead of the chunked terminator; or refused an upload early): read the rest and
        drop it, so the connection the response left open serves the next request. Past `_DISCARD_LIMIT`
        bytes, or the header timeout, the connection closes instead."""
        budget = _DISCARD_LIMIT - len(body.take_buffered())
        if budget < 0 or (body.expected is not None and body.expected - body.received > budget):
            self._linger_close()
            return

        def drop(chunk: bytes) -> None:
            nonlocal budget
            budget -= len(chunk)
            if budget < 0:
                body.detach()
                self._linger_close()

        def done() -> None:
            body.detach()
            self._cancel_timer()
            self._serve_next()

        self._arm(self.limits.read_header_timeout, self._linger_close)
        body.attach(drop, done)

    def _serve_next(self) -> None:
        """After a response: the next pipelined request, or wait (idle) for one."""
        if self.closed:
            return
        if self._pending and self.write_paused and self.tunnel is None:
            # Answers are backing up: the next request starts once the client has read them (`resume_writing`).
            # A client that never reads again is dropped after the keep-alive idle timeout.
            self._next_waits_for_write = True
            self.pause_reading_for_body("write")
            self._arm(self.limits.idle_timeout, self._idle_expired)
            return
        if self._pending:
            nxt = self._pending.popleft()
            if not self._pending:
                self.resume_reading_for_body("pipeline")
            self._start(nxt)
            return
        self._await_next()

    def _await_next(self) -> None:
        """No request is due: arm the clock for the next one."""
        current = self._current
        if current is not None and current.body is None and "write" not in self._reading_paused_for:
            # A head begun while the previous request was served (and not finished yet): its clock starts
            # now, as Go's server reads the next request under its read-header deadline. Nothing was armed
            # until December 6: a client that sent half a head there held the connection for good. (While
            # reading is paused for the client's unread answers, the idle timeout runs instead.)
            self._arm(self.limits.read_header_timeout, self._header_timeout)
        elif current is None or current.body is None or current.body.done:
            # `_current` is still the request whose body just ended when `_discard_rest` gets here (its
            # parser callback runs before the parser lets it go); the connection is idle all the same.
            self._arm(self.limits.idle_timeout, self._idle_expired)

    def _idle_expired(self) -> None:
        """The keep-alive idle timeout passed. Answers the client has not read in all that time (its write
        buffer is not empty) are dropped with the connection: a plain close would wait for a flush that a
        client which never reads never lets happen (the connection, its descriptor and buffer were kept for
        good until December 6)."""
        transport = self.transport
        if transport is not None and not self.closed and transport.get_write_buffer_size():
            self.abort()
        else:
            self.close()

    def pause_reading_for_body(self, reason: str = "body") -> None:
        if not self._reading_paused_for and self.transport is not None:
            self.transport.pause_reading()
        self._reading_paused_for.add(reason)

    def resume_reading_for_body(self, reason: str = "body") -> None:
        self._reading_paused_for.discard(reason)
        if not self._reading_paused_for and self.transport is not None and self.tunnel is None:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        """Close once what is buffered is written; a flush still not done after `--idle-timeout` (a client
        that stopped reading) ends in an abort (`transport.close()` alone would wait for it for good)."""
        transport = self.transport
        if self.closed:
            return  # closed already: a flush deadline the first close armed stays armed
        self._cancel_timer()
        if transport is not None:
            self.closed = True
            transport.close()
            if transport.get_write_buffer_size():
                # The sweeper keeps checking a closed connection until `connection_lost` unregisters it.
                self._arm(self.limits.idle_timeout, transport.abort)

    def abort(self) -> None:
        """Drop the connection now, unwritten bytes and all (one closed already is left to its flush and the
        deadline `close` armed for it)."""
        if self.closed:
            return
        self._cancel_timer()
        if self.transport is not None:
            self.closed = True
            self.transport.abort()

    def fail(self, status: int, detail: str, *, extra: bytes = b"") -> None:
        """Refuse what the client sent (malformed, too large, too slow): answer with a JSON error if no
        response has started, stop the active handler (it aborts its upstream exchange), close. `extra`:
        raw header lines (each ending in CRLF) for the answer."""
        if self._failed:
            return
        self._failed = True
        self.failed_status = status
        self._cancel_timer()
        if not self.response_started:
            self.write(json_response(status, {"detail": detail}, keep_alive=False, extra_headers=extra))
        if self._task is not None and not self._task.done() and self.handler_started:
            # A handler that has not run yet is left to run: it sees `failed_status` and only counts and logs
            # the request (cancelled before its first step, it did neither - a 413 for a body that came in
            # the head's packet was missing from metrics and the access log until December 6).
            self._task.cancel()
        self._linger_close()

    def _linger_close(self) -> None:
        """Close after a response the client may still be sending a request body to (an error, or an
        answer that came before the body ended) without resetting it away: closing a socket that still has
        unread input makes the kernel send RST, and the client would then lose the response. So: half-close,
        discard input for up to a second - reading resumed if a full body buffer had paused it - then close
        (as Go's server does)."""
        transport = self.transport
        if transport is None or self.closed or self._lingering:
            return
        self._lingering = True
        self._failed = True  # input from here on is drained unparsed
        self._reading_paused_for.clear()
        if self.tunnel is None:
            transport.resume_reading()
        try:
            if transport.can_write_eof():
                transport.write_eof()
            else:
                self.close()
                return
        except (OSError, RuntimeError):
            self.close()
            return
        asyncio.get_running_loop().call_later(1.0, self.close)

    def start_drain(self) -> None:
        """Shutdown: idle connections close now, busy ones after their current response."""
        self.draining = True
        if self._active is None and not self._in_head:
            self.close()

    @property
    def idle(self) -> bool:
        return self._active is None and not self._in_head

    # ------------------------------------------------------------------ timers

    # Per-request timers would cost two timer objects per request on a keep-alive connection; instead
    # each connection records one deadline and a sweeper checks all connections a few times a second
    # (timeouts here are seconds long; a quarter second of slack is fine).

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        if self.transport is not None:
            self.deadline = asyncio.get_running_loop().time() + delay
            self._on_deadline = callback

    def _cancel_timer(self) -> None:
        self.deadline = math.inf
        self._on_deadline = None

    def expire(self) -> None:
        """The deadline passed (called by the sweeper)."""
        callback = self._on_deadline
        self._cancel_timer()
        if callback is not None:
            callback()

    def _header_timeout(self) -> None:
        if self._active is None:
            self.fail(408, "Timed out reading the request headers.")


class DeadlineSweeper:
    """Fires connection deadlines (header read, keep-alive idle) for every connection of a router."""

    INTERVAL = 0.25

    def __init__(self, connections: set[ClientConnection]) -> None:
        self.connections = connections

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.INTERVAL)
            now = loop.time()
            for conn in [c for c in self.connections if c.deadline <= now]:
                conn.expire()


class _TooLarge(Exception):
    pass


class _BodyTooLarge(Exception):
    pass


class _Malformed(Exception):
    pass


class _UnsupportedCoding(Exception):
    pass
