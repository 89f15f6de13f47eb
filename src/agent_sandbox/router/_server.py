"""The proxy listener's HTTP/1.1 server side: one `ClientConnection` per accepted socket.

Owns: the connection's protocol events (accept, the h2c preface hand-off, write pressure, loss), the
request-level timeouts (read-header timeout -> 408 for slowloris clients, keep-alive idle timeout),
pipelining (requests are answered strictly in order; later ones wait with their bodies buffered up to a
bound), upgrade hand-off (the raw bytes after an upgrade request), and connection-level keep-alive/close
bookkeeping. Each request is handed to the `Handler` as a task. Built on `_request_reader.RequestReader`
(parsing with `httptools`: strict framing, so CL+TE smuggling, bare CR/LF and obs-fold are refused; header
bytes -> 431), which builds `_request.Request`s with their streaming bodies (`RequestBody`, flow-controlled),
and on `_connection.Connection` (writing, read pausing, closing, the deadline).

Does not own: what is done with a request (`_proxy.Proxy`), TLS (the listener's SSL context).

Failure modes: malformed HTTP -> 400 JSON and close; a client that disappears mid-request cancels its
handler (which aborts the upstream exchange).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

from ._fdlimit import EXHAUSTED_DETAIL
from ._request import Request, RequestBody
from ._request_reader import RequestReader

__all__ = [
    "H2C_PREFACE",
    "ClientConnection",
    "ConnectionLimits",
    "DeadlineSweeper",
    "Handler",
]

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


class ClientConnection(RequestReader):
    """One client connection on the proxy listener."""

    limits: ConnectionLimits

    def __init__(
        self,
        handler: Handler,
        limits: ConnectionLimits,
        *,
        scheme: str,
        registry: set[ClientConnection] | None = None,
        client_cert_required: bool = False,
    ) -> None:
        super().__init__(limits)
        self.handler = handler
        self._client_cert_required = client_cert_required
        self._registry = registry
        self.scheme = scheme
        self.client_ip = ""
        self.draining = False
        self.write_paused = False
        self.on_write_pause: Callable[[bool], None] | None = None
        """Set by the active exchange: called with True/False when the client write buffer fills/drains."""
        self.on_lost: Callable[[], None] | None = None
        self.on_drain: Callable[[], None] | None = None
        """Set by a protocol that took the connection over (h2c): shutdown asks it to end the connection
        itself (it closes it once its streams are done); until then the connection holds the drain up."""
        self._active: Request | None = None
        self._pending: deque[Request] = deque()
        self._next_waits_for_write = False
        """A pipelined request is due but the client's write buffer is full: it starts on `resume_writing`."""
        self._first_data = True
        self._preface_start = b""
        self._refusal: tuple[int, str] | None = None
        """What follows the requests being answered cannot be served: sent once they are (`_refuse`)."""

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
        if self._failed or self._refusal is not None:
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
            # The earlier reads' bytes only (a head is measured exactly once parsed, `on_headers_complete`):
            # this read may carry the end of the head and much of the body. Counted before parsing, a read of
            # up to 256 KiB over a small `--max-request-header-bytes` (+ 64 KiB) was refused 431 whole. What
            # httptools buffers of a head that never ends stays bounded: the cap, the slack and one read.
            if self._head_bytes > self.limits.max_header_bytes + _HEAD_SLACK:
                self._refuse(431, "Request header fields too large.")
                return
            self._head_bytes += len(data)
        self._feed(data)

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

    def _received(self, req: Request) -> None:
        if self._active is None:
            self._cancel_timer()
            self._start(req)
        else:
            self._pending.append(req)
            self.pause_reading_for_body("pipeline")

    def _refuse(self, status: int, detail: str) -> None:
        """Requests read whole before what cannot be served (pipelined, or in the same packet) are answered
        first, in order, and then the refusal, as Go's server does (it reads a request only after answering
        the one before). Until December 7 the refusal went out at once: a request in the same packet ahead of
        bytes that do not parse was dropped unanswered (its PUT never ran), one being served was cut. Input
        after the refusal is not read. A refusal in the body of the request being served is sent now (its
        handler is stopped); a pipelined request whose body breaks is dropped with its refusal."""
        active = self._active
        if active is None or self._failed:
            self.fail(status, detail)
            return
        broken = self._current if self._current is not None and self._current.body is not None else None
        if broken is active:
            self.fail(status, detail)
            return
        if broken is not None and broken in self._pending:
            self._pending.remove(broken)
        self._refusal = (status, detail)
        self._current = None
        self._in_head = False
        self.pause_reading_for_body("refused")

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
        if self._refusal is not None and not self._pending:
            self.fail(*self._refusal)  # the requests read before it are answered (`_refuse`)
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

    def start_drain(self) -> None:
        """Shutdown: idle connections close now, busy ones after their current response; one taken over
        (h2c) ends itself (`on_drain`). Until December 7 an h2c connection, which has no HTTP/1.1 request,
        was taken for idle and closed at once, with every gRPC stream on it."""
        self.draining = True
        if self.on_drain is not None:
            self.on_drain()
        elif self._active is None and not self._in_head:
            self.close()

    @property
    def idle(self) -> bool:
        return self._active is None and not self._in_head and self.on_drain is None

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
