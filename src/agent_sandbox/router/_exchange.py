"""One attempt of a proxied request: the request written to one upstream connection, its response relayed.

Owns: streaming the request body to the sandbox as it arrives (chunked bodies re-framed, never buffered)
and the response to the client as it arrives (trailer fields relayed both ways), with flow control both ways (a full write buffer pauses
the reading side), so memory per request is bounded whatever the body size; the response head rewritten
for the client (hop-by-hop headers dropped, chunked or close framing, `101` passed on only to an upgrade
request); the per-attempt timers (`--response-header-timeout` from the end of the request body; before it
and after the response head, the request's limit as the longest time with no byte relayed either way, so
a long download, upload or command stream is not cut while it moves - the legacy router's per-read
timeout - and a stalled one is); and what an upstream failure means for this attempt: "retry"
(`may_resend`: Go's transport rule - a pooled keep-alive connection that ended before any response byte,
for a request that may be sent twice, with the whole request still in hand), "unanswered" (a connection
closed before any response byte, for a request that may run twice, the whole request in hand, when the
caller can wait for a replacement pod), "refused" (a draining runtime's `503` with `X-Sandbox-Not-Started`:
nothing of it ran; same conditions but any method), 502/504 before the response head, or closing the client
connection after it.

Does not own: dialling, retries of dial failures and the hand-off of an upgraded connection (`_proxy`),
parsing the sandbox's responses (`_upstream`), or the request head (`_headers`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..api.lifecycle import HEADER_NOT_STARTED
from ._headers import DROP_RESPONSE_HEADERS, declared_trailers, last_chunk, request_head
from ._outcome import Outcome, connect_error, reply, timeout_error
from ._request import Request, trailer_allowed
from ._resolve import Target
from ._responses import status_line
from ._routing import Route
from ._server import ClientConnection
from ._upstream import UpstreamConnection

if TYPE_CHECKING:
    from ._proxy import Proxy

__all__ = ["Exchange", "may_resend"]

_REPLAY_LIMIT = 64 * 1024

_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_IDEMPOTENCY_KEYS = (b"idempotency-key", b"x-idempotency-key")
_NOT_STARTED = HEADER_NOT_STARTED.lower().encode()


def _may_run_twice(method: str, idempotency_key: bool) -> bool:
    """GET, HEAD, OPTIONS, TRACE, or a request carrying `Idempotency-Key` / `X-Idempotency-Key` (Go's
    `isReplayable` without the body condition)."""
    return method in _IDEMPOTENT_METHODS or idempotency_key


def may_resend(
    *,
    method: str,
    idempotency_key: bool,
    reused: bool,
    written: bool,
    whole_in_hand: bool,
    reason: str,
    head_seen: bool,
) -> bool:
    """Whether a request whose upstream connection failed goes out again on a fresh connection.

    Go's net/http Transport rule, which upstream's router (httputil.ReverseProxy) runs by: transport.go
    `shouldRetryRequest` and request.go `isReplayable`. Never after a response byte, nor on a fresh
    connection (the sandbox hung up on this request, not on an idle connection). On a pooled one: when
    nothing of the request was written, if it can be sent whole again; else only a request that may run
    twice - GET, HEAD, OPTIONS, TRACE, or one carrying `Idempotency-Key` / `X-Idempotency-Key` - and only
    when the connection ended before any response byte (`reason` "eof": Go's errServerClosedIdle /
    transportReadFromServerError), not on a malformed answer. A POST the runtime read and started (a command
    whose runtime then died) is never sent twice: the client gets the 502.

    `whole_in_hand`: no body, or all of it still held (`RequestBody.rewind`) - Go's `GetBody`. Upstream's
    ReverseProxy has no `GetBody`, so it never resends a request with a body; ours resends a small one
    (up to 64 KiB) of an idempotent request too (docs/router.md).
    """
    if not reused or head_seen or not whole_in_hand:
        return False
    if not written:
        return True
    return _may_run_twice(method, idempotency_key) and reason == "eof"


class Exchange:
    """One attempt: a request written to one upstream connection and its response relayed to the client.

    Implements `_upstream.ResponseSink`; the upstream connection calls it as response bytes arrive.
    """

    def __init__(
        self,
        proxy: Proxy,
        conn: ClientConnection,
        req: Request,
        route: Route,
        out: Outcome,
        upstream: UpstreamConnection,
        target: Target,
    ) -> None:
        self.proxy = proxy
        self.conn = conn
        self.req = req
        self.route = route
        self.out = out
        self.upstream = upstream
        self.target = target
        self.upgrade_tail = b""
        self._fut: asyncio.Future[str] | None = None
        self._chunked_out = False
        self._close_client = False
        self._body_sent = False
        self._written = True
        self._resendable = False
        self._unanswered_ok = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._head_seen = False
        self._pending: list[bytes] = []
        self._trailers: list[tuple[bytes, bytes]] = []
        """The response's trailer fields, relayed with the last chunk (`response_trailers`)."""
        self._loop = asyncio.get_running_loop()
        self._limit = 0.0
        self._moved = 0.0  # loop time a byte was last relayed either way; the idle timer counts from it
        self._last_use = time.monotonic()  # the same, on the clock lifecycle activity reads (`last_traffic`)
        self._header_timeout = 0.0
        self._idle_due = False

    async def run(
        self, limit: float, header_timeout: float, span: Any, *, unanswered_ok: bool = False
    ) -> str:
        """Send the request and relay the response; returns "done", "retry", "unanswered", "refused" or
        "upgraded".

        `limit`: the longest the request may go with no byte relayed; `header_timeout` (at most `limit`): the
        longest wait for the response head once the request is sent. "unanswered" and "refused" only with
        `unanswered_ok`; the caller then answers the client (nothing was sent yet).
        """
        loop = self._loop
        self._unanswered_ok = unanswered_ok
        conn, req, upstream = self.conn, self.req, self.upstream
        self._fut = fut = loop.create_future()
        upstream.begin(self, head_only=req.method == "HEAD")
        head = request_head(conn, req, self.target, span, self.proxy.propagator)
        body = req.body
        assert body is not None
        has_body = req.chunked or bool(req.content_length)
        # Go's nothingWrittenError: the pool hands out no connection known closed (`UpstreamPool.take` also
        # peeks for a close not read yet), so this is True but for a close seen in between.
        self._written = not upstream.closed
        if not has_body:
            self._body_sent = True
            self._resendable = True
            upstream.write(head)
        else:
            data = body.take_buffered()
            if req.chunked and data:
                data = b"%x\r\n%b\r\n" % (len(data), data)
            if body.done:
                payload = head + data + (last_chunk(req.trailers) if req.chunked else b"")
                self._body_sent = True
                self._resendable = len(payload) <= _REPLAY_LIMIT
                upstream.write(payload)
            else:
                upstream.write(head + data if data else head)
                body.attach(self._body_chunk, self._body_done)
        conn.on_write_pause = self._client_write_pause
        if conn.write_paused:
            self._client_write_pause(True)
        # Timers (one armed at a time): the response-header timeout runs from the end of the request body
        # (Go's ResponseHeaderTimeout); until then, and after the head, the idle limit.
        self._limit = limit
        self._header_timeout = min(header_timeout, limit)
        self._moved = loop.time()
        if self._body_sent:
            self._start_header_timer()
        else:
            self._idle_timer = loop.call_at(self._moved + limit, self._idle_check)
        try:
            result: str = await fut
            return result
        finally:
            self._cancel_timers()
            body.detach()
            conn.on_write_pause = None
            conn.resume_reading_for_body("upstream")
            if not fut.done() or fut.cancelled() or (fut.result() != "upgraded" and upstream.sink is self):
                upstream.abort()

    # ------------------------------------------------------------------ lifecycle activity (`Traffic`)

    @property
    def awaiting_response(self) -> bool:
        """In use until the response head, whatever moves: a slow call sends nothing while it runs."""
        return not self._head_seen

    @property
    def last_traffic(self) -> float:
        """When a byte was last relayed either way (`time.monotonic()`): after the head, the response is use
        only while it moves (a download), not while it is held open in silence (an EventSource, a long-poll:
        a tab left open overnight). Until December 7 the whole exchange counted, and such a tab kept its
        Sandbox up for as long as it stayed open."""
        return self._last_use

    # ------------------------------------------------------------------ request body

    def _body_chunk(self, chunk: bytes) -> None:
        self._moved = self._loop.time()
        self._last_use = time.monotonic()
        if self.req.chunked:
            self.upstream.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            self.upstream.write(chunk)

    def _body_done(self) -> None:
        if self.req.chunked:
            # the trailer fields came before the end of the body was reported (`RequestReader._on_trailer`)
            self.upstream.write(last_chunk(self.req.trailers))
        self._body_sent = True
        if not self._head_seen:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            self._start_header_timer()

    def _start_header_timer(self) -> None:
        self._header_timer = self._loop.call_later(self._header_timeout, self._header_timed_out)

    def _header_timed_out(self) -> None:
        settings = self.proxy.settings
        knob = "--response-header-timeout"
        if self.route.timeout is None and settings.proxy_timeout < settings.response_header_timeout:
            knob = "--proxy-timeout"
        self._timed_out("no response within", self._header_timeout, knob)

    def _idle_check(self) -> None:
        self._idle_timer = None
        due = self._moved + self._limit
        if self._loop.time() < due:
            self._idle_timer = self._loop.call_at(due, self._idle_check)
        else:
            self._timed_out("nothing relayed either way for", self._limit, "--proxy-timeout")

    def upstream_pause_writing(self) -> None:
        self.conn.pause_reading_for_body("upstream")

    def upstream_resume_writing(self) -> None:
        self.conn.resume_reading_for_body("upstream")

    def _client_write_pause(self, paused: bool) -> None:
        transport = self.upstream.transport
        # Once the response is complete the connection is the pool's (or closed): the last bytes' flush can
        # fill the client's buffer after that, and pausing then would stall whoever uses it next.
        if transport is None or self.upstream.closed or self.upstream.sink is not self:
            return
        if paused:
            transport.pause_reading()
        else:
            transport.resume_reading()

    # ------------------------------------------------------------------ response (ResponseSink)

    def response_head(self, status: int, headers: list[tuple[bytes, bytes]], streamed: bool) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
            self._idle_due = True  # armed by flush() only if the response is not complete by then
        if (
            status == 503
            and self._unanswered_ok
            and self._resendable
            and self._body_sent
            and any(name.lower() == _NOT_STARTED for name, _ in headers)
        ):
            # Ours: a draining runtime says it did not start this request (its pod is going away): held and
            # sent whole to the pod that replaces it, as a dial the draining pod refused (`Proxy._forward`).
            # Not relayed: the client sees the replacement's answer, or the router's own 503.
            self.upstream.abort()
            fut = self._fut
            if fut is not None and not fut.done():
                fut.set_result("refused")
            return
        self._head_seen = True
        conn, req, out = self.conn, self.req, self.out
        if status == 101 and not req.upgrade:
            self._fail_request(
                502,
                "Backend attempted a WebSocket upgrade over HTTP. Connect using the WebSocket protocol instead.",
                "other",
            )
            return
        tokens: tuple[bytes, ...] = ()
        for name, value in headers:
            if name.lower() == b"connection":
                tokens += tuple(t.strip().lower() for t in value.split(b",") if t.strip())
        parts = [status_line(status)]
        upgrade_value = b""
        for name, value in headers:
            lname = name.lower()
            if lname in DROP_RESPONSE_HEADERS or (tokens and lname in tokens):
                if lname == b"upgrade":
                    upgrade_value = value
                continue
            parts += (name, b": ", value, b"\r\n")
        # A declined upgrade (no 101) ends the connection (finish_request): say so, or a keep-alive client
        # sends its next request into a closing connection (until December 6).
        keep = out.keep_alive and not conn.draining and not req.upgrade
        if status == 101:
            parts += (b"Connection: Upgrade\r\nUpgrade: ", upgrade_value, b"\r\n")
        else:
            if streamed:
                if req.version == "1.1":
                    self._chunked_out = True
                    parts.append(b"Transfer-Encoding: chunked\r\n")
                    parts.append(declared_trailers(v for n, v in headers if n.lower() == b"trailer"))
                else:
                    keep = False
            if not keep:
                parts.append(b"Connection: close\r\n")
            elif req.version == "1.0":
                parts.append(b"Connection: keep-alive\r\n")
        parts.append(b"\r\n")
        out.keep_alive = keep
        out.status = status
        data = b"".join(parts)
        # `bytes_out` counts body bytes only (`response_body`), as upstream's access log does.
        conn.response_started = True
        self._pending.append(data)

    def response_body(self, chunk: bytes) -> None:
        self.out.bytes_out += len(chunk)
        if self._chunked_out:
            self._pending.append(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            self._pending.append(chunk)

    def response_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        # Relayed as Go's ReverseProxy does, when the client's response is chunked (an HTTP/1.0 client's is
        # not: dropped); framing, hop-by-hop and router-owned fields are not (`trailer_allowed`). Until
        # December 7 every response trailer was dropped.
        self._trailers = [(n, v) for n, v in fields if trailer_allowed(n.lower())]

    def flush(self) -> None:
        """Write what one read from the sandbox produced in a single send (head + body + end)."""
        pending = self._pending
        if pending:
            self.conn.write(pending[0] if len(pending) == 1 else b"".join(pending))
            pending.clear()
            self._moved = self._loop.time()
            self._last_use = time.monotonic()
        if self._idle_due:
            self._idle_due = False
            fut = self._fut
            if fut is not None and not fut.done() and self._idle_timer is None:
                self._idle_timer = self._loop.call_at(self._moved + self._limit, self._idle_check)

    def response_complete(self, reusable: bool) -> None:
        fut = self._fut
        if fut is None or fut.done():
            return
        if self._chunked_out:
            self._pending.append(last_chunk(self._trailers))
        if not self._body_sent:
            # The sandbox answered before taking the whole body: this upstream connection is in the middle of
            # a request and cannot be reused; the client's stays open as the response said, its connection
            # reading the rest of the body (`ClientConnection._discard_rest`).
            self.upstream.close()
        elif reusable:
            self.proxy.pool.put(self.upstream)
        else:
            self.upstream.close()
        fut.set_result("done")

    def response_upgraded(self, tail: bytes) -> None:
        fut = self._fut
        if fut is None or fut.done():
            return
        self.upgrade_tail = tail
        self.flush()
        fut.set_result("upgraded")

    def upstream_failed(self, reason: str, error: BaseException | None) -> None:
        fut = self._fut
        if fut is None or fut.done():
            return
        req = self.req
        idempotency_key = any(lname in _IDEMPOTENCY_KEYS for lname, _, _ in req.headers)
        if may_resend(
            method=req.method,
            idempotency_key=idempotency_key,
            reused=self.upstream.reused,
            written=self._written,
            whole_in_hand=self._resendable,
            reason=reason,
            head_seen=self._head_seen,
        ):
            # A pooled keep-alive connection the sandbox closed as the request went out: send again on a
            # fresh one. Until December 7 any request up to 64 KiB was, a POST /execute too: a runtime
            # that died running it ran the command twice once restarted.
            fut.set_result("retry")
            return
        if (
            reason == "eof"
            and not self._head_seen
            and self._resendable
            and self._unanswered_ok
            and _may_run_twice(req.method, idempotency_key)
        ):
            # A fresh connection the sandbox closed unanswered: its pod may be going away (a suspend). Only a
            # request that may run twice is held for the replacement, Go's rule for a pooled connection
            # (`may_resend`): the runtime may have read this one and been stopped (SIGKILL, or its stop
            # deadline) while running it. Until December 7 a POST /execute was sent again too, and its command
            # ran twice; a draining runtime that did not start a request says so (`response_head`, "refused").
            fut.set_result("unanswered")
            return
        self.proxy.metrics.upstream_error(self.route.namespace, reason)
        if self.conn.response_started:
            self.out.keep_alive = False
            self.flush()
            self.conn.abort()
            fut.set_result("done")
        else:
            self._fail_request(502, connect_error(self.route), None)

    def _timed_out(self, waited_for: str, seconds: float, knob: str) -> None:
        fut = self._fut
        if fut is None or fut.done():
            return
        self.proxy.metrics.upstream_error(self.route.namespace, "timeout")
        if self.conn.response_started:
            self.out.keep_alive = False
            self.upstream.abort()
            self.conn.abort()
            fut.set_result("done")
        else:
            detail = timeout_error(self.route, waited_for, seconds, self.proxy.settings.proxy_timeout, knob)
            self._fail_request(504, detail, None)

    def _fail_request(self, status: int, detail: str, reason: str | None) -> None:
        fut = self._fut
        assert fut is not None
        if reason is not None:
            self.proxy.metrics.upstream_error(self.route.namespace, reason)
        self.upstream.abort()
        reply(self.conn, self.out, status, detail, self.req)
        if not fut.done():
            fut.set_result("done")

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._idle_timer = None
