"""The per-request proxy flow: validate -> authorize -> resolve -> dial (with retries) -> stream.

Owns: the order of checks (router spec §1.6: header validation 400 -> authorization 401/403/500 ->
resolution -> forwarding 502/504), `/healthz` on the proxy port, the request-target rules (origin form
forwarded byte for byte, absolute form reduced to path+query, anything else 400), header rewriting both
ways (§1.5), the timeouts (`--proxy-timeout` for the whole exchange, `--response-header-timeout` per
attempt, `X-Sandbox-Timeout` capped at the proxy timeout), retries of dial-phase failures only (§1.7:
200 -> 400 -> 800 ms, bounded by the deadline, resolving again before each attempt; a request is also
re-sent once on a fresh connection when a pooled keep-alive connection turns out dead before any
response byte and the whole request is still in hand), metrics, access log and the request span.

Streaming: the request body goes to the sandbox as it arrives and the response to the client as it
arrives, with flow control both ways (a full write buffer pauses the reading side), so memory per
request is bounded whatever the body size. Chunked bodies are re-framed, never buffered.

Errors the router generates are JSON `{"detail": ...}`; a failure after the response head was sent can
only be signalled by closing the client connection.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any

import httptools

from ..api.errortext import describe_error
from ._accesslog import AccessLog
from ._lifecycle import RETRY_AFTER, ResumeFailed, RouterLifecycle
from ._metrics import RouterMetrics
from ._podcache import PodEntry
from ._resolve import Resolver, Target
from ._responses import HEALTHZ_BODY, json_response, status_line
from ._routing import Route, RouteError, parse_route
from ._server import ClientConnection, Request
from ._tunnel import Tunnel, TunnelLimits
from ._upstream import UpstreamConnection, UpstreamPool

__all__ = ["Proxy", "ProxySettings"]

log = logging.getLogger("agent_sandbox.router.proxy")

# Request headers never forwarded: hop-by-hop (RFC 9110 §7.6.1), the ones we rewrite, and credentials.
_DROP_REQUEST = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"authorization",
        b"expect",
        b"x-forwarded-for",
        b"x-forwarded-host",
        b"x-forwarded-proto",
    }
)
_DROP_RESPONSE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_REPLAY_LIMIT = 64 * 1024
_HOST_DEAD = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MAX_HOLDS = 2  # a request waits for its Sandbox's resume at most this often (a replaced pod: twice)
_INTERNAL = "An internal error occurred in the proxy."


def _connect_error(route: Route) -> str:
    return f"Could not connect to the backend sandbox: {route.sandbox_id}"


def _timeout_error(route: Route) -> str:
    return f"Timed out waiting for the backend sandbox: {route.sandbox_id}"


class ProxySettings:
    """The subset of `RouterConfig` the request path reads (plain attributes: read per request)."""

    __slots__ = (
        "allow_loopback",
        "max_body_bytes",
        "max_concurrent",
        "max_retries",
        "proxy_timeout",
        "response_header_timeout",
        "retry_initial",
        "retry_max",
    )

    def __init__(
        self,
        *,
        proxy_timeout: float = 180.0,
        response_header_timeout: float = 30.0,
        max_retries: int = 3,
        retry_initial: float = 0.2,
        retry_max: float = 0.8,
        allow_loopback: bool = False,
        max_body_bytes: int = 0,
        max_concurrent: int = 0,
    ) -> None:
        self.proxy_timeout = proxy_timeout
        self.response_header_timeout = response_header_timeout
        self.max_retries = max_retries
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.allow_loopback = allow_loopback
        self.max_body_bytes = max_body_bytes
        self.max_concurrent = max_concurrent


class _Outcome:
    """What one request ended as (read by metrics, access log and keep-alive)."""

    __slots__ = ("bytes_out", "keep_alive", "namespace", "sandbox_id", "status", "upgraded")

    def __init__(self) -> None:
        self.status = 0
        self.namespace = ""
        self.sandbox_id = ""
        self.bytes_out = 0
        self.keep_alive = True
        self.upgraded = False


class Proxy:
    """The proxy listener's request handler (`_server.Handler`)."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        resolver: Resolver,
        authorizer: Any,
        metrics: RouterMetrics,
        pool: UpstreamPool | None = None,
        tunnel_limits: TunnelLimits | None = None,
        access_log_enabled: bool = True,
        tracer: Any = None,
        propagator: Any = None,
        lifecycle: RouterLifecycle | None = None,
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self.authorizer = authorizer
        self.metrics = metrics
        self.pool = pool or UpstreamPool()
        self.tunnel_limits = tunnel_limits or TunnelLimits()
        self.access_log = AccessLog() if access_log_enabled else None
        self.tracer = tracer
        self.propagator = propagator
        self.inflight = 0
        self.tunnels: set[Tunnel] = set()
        self.lifecycle = lifecycle

    # ------------------------------------------------------------------ entry point

    async def handle(self, conn: ClientConnection, req: Request) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        out = _Outcome()
        out.keep_alive = req.keep_alive
        self.inflight += 1
        self.metrics.inflight.inc()
        span = self._start_span(req) if self.tracer is not None else None
        try:
            await self._serve(conn, req, out, start, span)
        except asyncio.CancelledError:
            # The client went away or sent something we refused mid-request (`ClientConnection.fail`).
            out.status = out.status or conn.failed_status or 499
            out.keep_alive = False
        except Exception:
            log.exception("proxy: unexpected error")
            if not conn.response_started:
                self._reply(conn, out, 500, _INTERNAL, req)
            out.status = out.status or 500
            out.keep_alive = False
        finally:
            self.inflight -= 1
            self.metrics.inflight.dec()
            if out.status:
                elapsed = loop.time() - start
                self.metrics.observe_request(req.method, out.status, out.namespace, elapsed)
                if span is not None:
                    self._end_span(span, out)
                if self.access_log is not None and self.access_log.enabled():
                    self._log(self.access_log, conn, req, out, elapsed, span)
            conn.finish_request(keep_alive=out.keep_alive)

    # ------------------------------------------------------------------ the flow

    async def _serve(
        self, conn: ClientConnection, req: Request, out: _Outcome, start: float, span: Any
    ) -> None:
        settings = self.settings
        if req.method == "CONNECT":
            self._reply(conn, out, 405, "Method not allowed.", req)
            return
        url = req.url
        if url[:1] != b"/":
            if url.startswith((b"http://", b"https://")):
                parsed = httptools.parse_url(url)
                url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
            else:
                self._reply(conn, out, 400, "Invalid request target.", req)
                return
        q = url.find(b"?")
        if (url if q < 0 else url[:q]) == b"/healthz":
            self._healthz(conn, req, out)
            return
        try:
            route = parse_route(req.routing, req.duplicates, allow_loopback=settings.allow_loopback)
        except RouteError as exc:
            self._reply(conn, out, exc.status, exc.detail, req)
            return
        out.namespace = route.namespace
        out.sandbox_id = route.sandbox_id
        if span is not None:
            span.set_attribute("sandbox.id", route.sandbox_id)
            span.set_attribute("sandbox.namespace", route.namespace)
        if settings.max_concurrent and self.inflight > settings.max_concurrent:
            self._reply(conn, out, 503, "Too many concurrent requests.", req, extra=b"Retry-After: 1\r\n")
            return
        try:
            pending = self.authorizer.check(route, req.authorization)
            if pending is not None:
                await pending
        except RouteError as exc:
            self.metrics.authz_decision(route.namespace, False)
            self._reply(conn, out, exc.status, exc.detail, req)
            return
        self.metrics.authz_decision(route.namespace, True)
        body = req.body
        assert body is not None
        limit = settings.max_body_bytes
        if limit and req.content_length is not None and req.content_length > limit:
            self._reply(conn, out, 413, "Request body too large.", req)
            return
        timeout = (
            settings.proxy_timeout if route.timeout is None else min(route.timeout, settings.proxy_timeout)
        )
        # A client that states how long it will wait (X-Sandbox-Timeout) also waits that long for headers.
        header_timeout = settings.response_header_timeout if route.timeout is None else timeout
        suspending = False
        if self.lifecycle is not None:
            # Ours (docs/lifecycle.md): activity of a Sandbox with an idle timeout; written first when due.
            urgent = self.lifecycle.record(route.namespace, route.sandbox_id)
            if urgent is not None:
                suspending = await urgent
        if req.expect_continue and not body.done:
            conn.write(_CONTINUE)
        client_key = ""
        if req.upgrade:
            forwarded = next((v for lname, _, v in req.headers if lname == b"x-forwarded-for"), None)
            client_key = self.tunnel_limits.client_key(conn.client_ip, forwarded)
            if not self.tunnel_limits.admit(client_key):
                limit = self.tunnel_limits.max_per_client
                self._reply(
                    conn, out, 429, f"Too many concurrent WebSocket connections (limit: {limit}).", req
                )
                return
        try:
            await self._forward(conn, req, route, out, start + timeout, header_timeout, span, suspending)
        finally:
            if req.upgrade:
                self.tunnel_limits.release(client_key)

    async def _hold(
        self,
        conn: ClientConnection,
        out: _Outcome,
        req: Request,
        route: Route,
        deadline: float,
        failed: PodEntry | None,
    ) -> bool | None:
        """Ours: hold the request while its Sandbox resumes (`RouterLifecycle.hold`).

        Returns True when a Ready pod is there (dial again), False when this Sandbox is not held, None when
        it cannot resume and the 503 was sent.
        """
        assert self.lifecycle is not None
        try:
            return await self.lifecycle.hold(route, deadline, failed)
        except ResumeFailed as refused:
            retry_after = b"Retry-After: %d\r\n" % RETRY_AFTER
            self._reply(conn, out, refused.status, refused.detail, req, extra=retry_after)
            return None

    async def _forward(
        self,
        conn: ClientConnection,
        req: Request,
        route: Route,
        out: _Outcome,
        deadline: float,
        header_timeout: float,
        span: Any,
        suspending: bool = False,
    ) -> None:
        settings = self.settings
        loop = asyncio.get_running_loop()
        resolver = self.resolver
        delay = settings.retry_initial
        retries = 0
        holds = 0
        fresh = False
        if suspending and self.lifecycle is not None:
            # Ours: the activity write found the Sandbox just suspended: not to its dying pod, wait for the next.
            holds += 1
            if await self._hold(conn, out, req, route, deadline, self.lifecycle.current_pod(route)) is None:
                return
        while True:
            target: Target | None = None
            try:
                target = resolver.resolve_fast(route)
                if target is None:
                    async with asyncio.timeout_at(deadline):
                        target = await resolver.resolve(route)
                upstream = None if fresh else self.pool.take((target.host, target.port))
                if upstream is None:
                    upstream = await self.pool.dial(target.host, target.port, deadline=deadline)
            except RouteError as exc:
                self._reply(conn, out, exc.status, exc.detail, req)
                return
            except (OSError, TimeoutError) as exc:
                timed_out = isinstance(exc, TimeoutError)
                host_dead = timed_out or getattr(exc, "errno", None) in _HOST_DEAD
                if (
                    host_dead
                    and target is not None
                    and target.source in ("cache", "cache-name")
                    and resolver.invalidate(target, by_uid=target.source == "cache")
                ):
                    self.metrics.cache_invalidation(route.namespace)
                if self.lifecycle is not None and holds < _MAX_HOLDS and loop.time() < deadline:
                    # Ours: a Sandbox that resumes on request is resumed (or waited for) instead of failing.
                    holds += 1
                    held = await self._hold(conn, out, req, route, deadline, target.entry if target else None)
                    if held is None:
                        return
                    if held:
                        retries, delay = 0, settings.retry_initial
                        continue
                if retries < settings.max_retries and loop.time() + delay < deadline:
                    retries += 1
                    self.metrics.upstream_retry(route.namespace)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, settings.retry_max)
                    continue
                log.info(
                    "upstream dial failed",
                    extra={
                        "sandbox_id": route.sandbox_id,
                        "sandbox_namespace": route.namespace,
                        "error": describe_error(exc),
                    },
                )
                self.metrics.upstream_error(route.namespace, "timeout" if timed_out else "dial")
                if loop.time() >= deadline:
                    self._reply(conn, out, 504, _timeout_error(route), req)
                else:
                    self._reply(conn, out, 502, _connect_error(route), req)
                return
            if span is not None and self.propagator is not None:
                span.set_attribute("sandbox.upstream_source", target.source)
            exchange = _Exchange(self, conn, req, route, out, upstream, target)
            result = await exchange.run(deadline, header_timeout, span)
            if result == "retry" and not fresh:
                fresh = True
                continue
            if result == "upgraded":
                await self._tunnel(conn, req, route, out, exchange)
            return

    async def _tunnel(
        self, conn: ClientConnection, req: Request, route: Route, out: _Outcome, exchange: _Exchange
    ) -> None:
        out.upgraded = True
        out.keep_alive = False
        is_ws = any(lname == b"upgrade" and v.strip().lower() == b"websocket" for lname, _, v in req.headers)
        tunnel = Tunnel(
            conn,
            exchange.upstream,
            client_tail=conn.upgrade_tail,
            upstream_tail=exchange.upgrade_tail,
            limits=self.tunnel_limits,
            websocket=is_ws,
        )
        self.tunnels.add(tunnel)
        try:
            await tunnel.run()
        finally:
            self.tunnels.discard(tunnel)
            out.bytes_out += tunnel.bytes_to_client

    # ------------------------------------------------------------------ replies

    def _reply(
        self,
        conn: ClientConnection,
        out: _Outcome,
        status: int,
        detail: str,
        req: Request,
        extra: bytes = b"",
    ) -> None:
        body_left = req.body is not None and not req.body.done
        keep = out.keep_alive and not body_left and not req.upgrade and not conn.draining
        data = json_response(
            status, {"detail": detail}, keep_alive=keep, head_only=req.method == "HEAD", extra_headers=extra
        )
        conn.response_started = True
        conn.write(data)
        out.status = status
        out.keep_alive = keep
        out.bytes_out += len(data)

    def _healthz(self, conn: ClientConnection, req: Request, out: _Outcome) -> None:
        keep = out.keep_alive and not conn.draining and (req.body is None or req.body.done)
        conn.response_started = True
        conn.write(json_response(200, HEALTHZ_BODY, keep_alive=keep, head_only=req.method == "HEAD"))
        out.keep_alive = keep
        # Probes are not counted or logged (router spec §1.14); status stays 0.

    def request_head(self, conn: ClientConnection, req: Request, target: Target, span: Any) -> bytes:
        """The request line and headers sent to the sandbox (router spec §1.5)."""
        url = req.url
        if url[:1] != b"/":
            parsed = httptools.parse_url(url)
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        parts = [req.method.encode("ascii"), b" ", url, b" HTTP/1.1\r\nHost: ", target.authority, b"\r\n"]
        tokens = req.connection_tokens
        upgrade = req.upgrade
        tracing = span is not None and self.propagator is not None
        for lname, name, value in req.headers:
            if lname in _DROP_REQUEST or (tokens and lname in tokens):
                continue
            if upgrade and lname == b"origin":
                continue
            if tracing and lname in _TRACE_HEADERS:
                continue
            parts += (name, b": ", value, b"\r\n")
        parts += (b"X-Forwarded-For: ", conn.client_ip.encode("ascii"), b"\r\n")
        if req.host:
            parts += (b"X-Forwarded-Host: ", req.host, b"\r\n")
        parts.append(
            b"X-Forwarded-Proto: https\r\n" if conn.scheme == "https" else b"X-Forwarded-Proto: http\r\n"
        )
        if upgrade:
            for lname, _, value in req.headers:
                if lname == b"upgrade":
                    parts += (b"Connection: Upgrade\r\nUpgrade: ", value, b"\r\n")
                    break
        elif req.chunked:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        if tracing:
            carrier: dict[str, str] = {}
            self.propagator.inject(carrier, context=_span_context(span))
            for field, text in carrier.items():
                parts += (field.encode("latin-1"), b": ", text.encode("latin-1"), b"\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    # ------------------------------------------------------------------ observability

    def _log(
        self,
        access: AccessLog,
        conn: ClientConnection,
        req: Request,
        out: _Outcome,
        elapsed: float,
        span: Any,
    ) -> None:
        path = req.path
        if path in (b"/healthz", b"/readyz", b"/metrics"):
            return
        ua = next((v for lname, _, v in req.headers if lname == b"user-agent"), b"")
        fields: dict[str, Any] = {
            "method": req.method,
            "path": path.decode("latin-1"),
            "status": out.status,
            "duration_ms": round(elapsed * 1000, 3),
            "client_ip": conn.client_ip,
            "sandbox_id": req.routing.get(b"x-sandbox-id", b"").decode("latin-1"),
            "sandbox_namespace": req.routing.get(b"x-sandbox-namespace", b"").decode("latin-1"),
            "bytes_out": out.bytes_out,
            "user_agent": ua.decode("latin-1"),
        }
        if span is not None:
            ctx = span.get_span_context()
            fields["trace_id"] = format(ctx.trace_id, "032x")
            fields["span_id"] = format(ctx.span_id, "016x")
        access.write(fields)

    def _start_span(self, req: Request) -> Any:
        carrier = {
            lname.decode("latin-1"): value.decode("latin-1")
            for lname, _, value in req.headers
            if lname in _TRACE_HEADERS
        }
        parent = self.propagator.extract(carrier) if carrier and self.propagator is not None else None
        span = self.tracer.start_span(
            f"HTTP {req.method}",
            context=parent,
            kind=_server_kind(),
            attributes={"http.method": req.method, "http.target": req.url.decode("latin-1")},
        )
        return span

    def _end_span(self, span: Any, out: _Outcome) -> None:
        span.set_attribute("http.status_code", out.status)
        span.end()


def _server_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.SERVER


def _span_context(span: Any) -> Any:
    from opentelemetry.trace import set_span_in_context

    return set_span_in_context(span)


class _Exchange:
    """One attempt: a request written to one upstream connection and its response relayed to the client.

    Implements `_upstream.ResponseSink`; the upstream connection calls it as response bytes arrive.
    """

    def __init__(
        self,
        proxy: Proxy,
        conn: ClientConnection,
        req: Request,
        route: Route,
        out: _Outcome,
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
        self._replayable = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._head_seen = False
        self._pending: list[bytes] = []
        self._deadline = 0.0
        self._header_timeout = 0.0
        self._deadline_due = False

    async def run(self, deadline: float, header_timeout: float, span: Any) -> str:
        """Send the request and relay the response; returns "done", "retry" or "upgraded"."""
        loop = asyncio.get_running_loop()
        conn, req, upstream = self.conn, self.req, self.upstream
        self._fut = fut = loop.create_future()
        upstream.begin(self, head_only=req.method == "HEAD")
        head = self.proxy.request_head(conn, req, self.target, span)
        body = req.body
        assert body is not None
        has_body = req.chunked or bool(req.content_length)
        if not has_body:
            self._body_sent = True
            self._replayable = upstream.reused
            upstream.write(head)
        else:
            data = body.take_buffered()
            if req.chunked and data:
                data = b"%x\r\n%b\r\n" % (len(data), data)
            if body.done:
                payload = head + data + (b"0\r\n\r\n" if req.chunked else b"")
                self._body_sent = True
                self._replayable = upstream.reused and len(payload) <= _REPLAY_LIMIT
                upstream.write(payload)
            else:
                upstream.write(head + data if data else head)
                body.attach(self._body_chunk, self._body_done)
        conn.on_write_pause = self._client_write_pause
        if conn.write_paused:
            self._client_write_pause(True)
        # Timers (one armed at a time in the common case): the response-header timeout runs from the end of
        # the request body (Go's ResponseHeaderTimeout); until then, and after the head, the deadline.
        self._deadline = deadline
        self._header_timeout = header_timeout
        if self._body_sent:
            self._start_header_timer()
        else:
            self._deadline_timer = loop.call_at(deadline, self._timed_out)
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

    # ------------------------------------------------------------------ request body

    def _body_chunk(self, chunk: bytes) -> None:
        if self.req.chunked:
            self.upstream.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            self.upstream.write(chunk)

    def _body_done(self) -> None:
        if self.req.chunked:
            self.upstream.write(b"0\r\n\r\n")
        self._body_sent = True
        if not self._head_seen:
            self._start_header_timer()

    def _start_header_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_at(
            min(loop.time() + self._header_timeout, self._deadline), self._timed_out
        )

    def upstream_pause_writing(self) -> None:
        self.conn.pause_reading_for_body("upstream")

    def upstream_resume_writing(self) -> None:
        self.conn.resume_reading_for_body("upstream")

    def _client_write_pause(self, paused: bool) -> None:
        transport = self.upstream.transport
        if transport is None or self.upstream.closed:
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
            self._deadline_due = True  # armed by flush() only if the response is not complete by then
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
            if lname in _DROP_RESPONSE or (tokens and lname in tokens):
                if lname == b"upgrade":
                    upgrade_value = value
                continue
            parts += (name, b": ", value, b"\r\n")
        keep = out.keep_alive and not conn.draining
        if status == 101:
            parts += (b"Connection: Upgrade\r\nUpgrade: ", upgrade_value, b"\r\n")
        else:
            if streamed:
                if req.version == "1.1":
                    self._chunked_out = True
                    parts.append(b"Transfer-Encoding: chunked\r\n")
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
        out.bytes_out += len(data)
        conn.response_started = True
        self._pending.append(data)

    def response_body(self, chunk: bytes) -> None:
        self.out.bytes_out += len(chunk)
        if self._chunked_out:
            self._pending.append(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            self._pending.append(chunk)

    def flush(self) -> None:
        """Write what one read from the sandbox produced in a single send (head + body + end)."""
        pending = self._pending
        if pending:
            self.conn.write(pending[0] if len(pending) == 1 else b"".join(pending))
            pending.clear()
        if self._deadline_due:
            self._deadline_due = False
            fut = self._fut
            if fut is not None and not fut.done() and self._deadline_timer is None:
                self._deadline_timer = asyncio.get_running_loop().call_at(self._deadline, self._timed_out)

    def response_complete(self, reusable: bool) -> None:
        fut = self._fut
        if fut is None or fut.done():
            return
        if self._chunked_out:
            self._pending.append(b"0\r\n\r\n")
        if not self._body_sent:
            # The sandbox answered before taking the whole body: neither side can be reused.
            self.out.keep_alive = False
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
        if not self._head_seen and self._replayable:
            # A pooled keep-alive connection the sandbox had already closed: send again on a fresh one.
            fut.set_result("retry")
            return
        self.proxy.metrics.upstream_error(self.route.namespace, reason)
        if self.conn.response_started:
            self.out.keep_alive = False
            self.flush()
            self.conn.abort()
            fut.set_result("done")
        else:
            self._fail_request(502, _connect_error(self.route), None)

    def _timed_out(self) -> None:
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
            self._fail_request(504, _timeout_error(self.route), None)

    def _fail_request(self, status: int, detail: str, reason: str | None) -> None:
        fut = self._fut
        assert fut is not None
        if reason is not None:
            self.proxy.metrics.upstream_error(self.route.namespace, reason)
        self.upstream.abort()
        self.proxy._reply(self.conn, self.out, status, detail, self.req)
        if not fut.done():
            fut.set_result("done")

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._deadline_timer = None
