"""The per-request proxy flow: validate -> authorize -> resolve -> dial (with retries) -> exchange.

Owns: the order of checks (router spec §1.6: header validation 400 -> authorization 401/403/500 ->
resolution -> forwarding 502/504), `/healthz` on the proxy port, the request-target rules (origin form
forwarded byte for byte, absolute form reduced to path+query, anything else 400), the timeouts
(`--proxy-timeout`, or `X-Sandbox-Timeout` capped at it: the time to reach the sandbox, then the longest
stretch with no byte relayed; `--response-header-timeout` per attempt unless the request set its
timeout), the admission limits (`--max-concurrent-requests` 503, a declared body over
`--max-request-body-bytes` 413, `--websocket-max-connections-per-client` 429), retries of
dial-phase failures only (§1.7: 200 -> 400 -> 800 ms, bounded by the deadline, resolving again before
each attempt; one more attempt on a fresh connection when the exchange asks for it), holding a request
while its Sandbox resumes, the hand-off of an upgraded connection to a `Tunnel`, and the request's
metrics, access-log line and span.

Does not own: one attempt's streaming, response relay and timers (`_exchange`), the request head sent
upstream (`_headers`), the router's own replies (`_outcome`), the span (`_tracing`) or the access-log
fields (`_accesslog`).

Errors the router generates are JSON `{"detail": ...}`; a failure after the response head was sent can
only be signalled by closing the client connection.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from typing import Any

import httptools

from ..api.errortext import describe_error
from ._accesslog import AccessLog, log_request
from ._exchange import Exchange
from ._fdlimit import EXHAUSTED_DETAIL, RESOURCE_ERRNOS, FdReport
from ._lifecycle import MAX_HOLDS, RETRY_AFTER, ResumeFailed, RouterLifecycle
from ._metrics import RouterMetrics
from ._outcome import Outcome, connect_error, healthz, not_started_error, reply, timeout_error
from ._podcache import PodEntry
from ._request import Request
from ._resolve import Resolver, Target
from ._routing import Route, RouteError, parse_route
from ._server import ClientConnection
from ._tracing import end_span, start_span
from ._tunnel import Tunnel, TunnelLimits
from ._upstream import UpstreamPool

__all__ = ["Proxy", "ProxySettings"]

log = logging.getLogger("agent_sandbox.router.proxy")

_HOST_DEAD = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_INTERNAL = "An internal error occurred in the proxy."


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
        self.fd_report = FdReport(metrics)

    def fd_guard(self, fd: int) -> bool:
        """`ConnectionLimits.fd_guard`: an accepted socket numbered `fd` is within the descriptor reserve
        (counted and logged as accept-side exhaustion)."""
        if self.fd_report.near_limit(fd):
            self.fd_report.exhausted("accept")
            return True
        return False

    def out_of_descriptors(self, namespace: str, exc: OSError) -> bool:
        """A dial failed because the router (or its host) ran out of descriptors or buffers: counted and
        logged as such; True when so (the caller answers 503, no retries: nothing is wrong with the sandbox)."""
        if exc.errno not in RESOURCE_ERRNOS:
            return False
        self.fd_report.exhausted("dial", exc)
        self.metrics.upstream_error(namespace, "resources")
        return True

    # ------------------------------------------------------------------ entry point

    async def handle(self, conn: ClientConnection, req: Request) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()  # loop time: the deadlines compare with it
        # Durations from perf_counter: uvloop's loop clock has whole-millisecond resolution and is read once
        # per loop iteration, so fast requests measured 0 (or whole ms) until December 6.
        began = time.perf_counter()
        out = Outcome()
        out.keep_alive = req.keep_alive
        self.inflight += 1
        self.metrics.inflight.inc()
        span = start_span(self.tracer, self.propagator, req) if self.tracer is not None else None
        conn.handler_started = True
        try:
            if conn.failed_status:  # refused by the connection before this ran (see `ClientConnection.fail`)
                out.status, out.keep_alive = conn.failed_status, False
                return
            await self._serve(conn, req, out, start, span)
        except asyncio.CancelledError:
            # The client went away or sent something we refused mid-request (`ClientConnection.fail`).
            out.status = out.status or conn.failed_status or 499
            out.keep_alive = False
        except Exception:
            log.exception("proxy: unexpected error")
            if not conn.response_started:
                reply(conn, out, 500, _INTERNAL, req)
            out.status = out.status or 500
            out.keep_alive = False
        finally:
            self.inflight -= 1
            self.metrics.inflight.dec()
            if out.allowed is not None:
                self.metrics.authz_decision(out.namespace, out.allowed)
            if out.status:
                elapsed = time.perf_counter() - began
                self.metrics.observe_request(req.method, out.status, out.namespace, elapsed)
                if span is not None:
                    end_span(span, out)
                if self.access_log is not None and self.access_log.enabled():
                    log_request(self.access_log, conn, req, out, elapsed, span)
            conn.finish_request(keep_alive=out.keep_alive)

    # ------------------------------------------------------------------ the flow

    async def _serve(
        self, conn: ClientConnection, req: Request, out: Outcome, start: float, span: Any
    ) -> None:
        settings = self.settings
        if req.method == "CONNECT":
            reply(conn, out, 405, "Method not allowed.", req)
            return
        url = req.url
        if url[:1] != b"/":
            if url.startswith((b"http://", b"https://")):
                parsed = httptools.parse_url(url)
                url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
            else:
                reply(conn, out, 400, "Invalid request target.", req)
                return
        q = url.find(b"?")
        if (url if q < 0 else url[:q]) == b"/healthz":
            healthz(conn, req, out)
            return
        try:
            route = parse_route(req.routing, req.duplicates, allow_loopback=settings.allow_loopback)
        except RouteError as exc:
            reply(conn, out, exc.status, exc.detail, req)
            return
        out.namespace = route.namespace
        out.sandbox_id = route.sandbox_id
        if span is not None:
            span.set_attribute("sandbox.id", route.sandbox_id)
            span.set_attribute("sandbox.namespace", route.namespace)
        if settings.max_concurrent and self.inflight > settings.max_concurrent:
            reply(conn, out, 503, "Too many concurrent requests.", req, extra=b"Retry-After: 1\r\n")
            return
        try:
            pending = self.authorizer.check(route, req.authorization)
            if pending is not None:
                await pending
        except RouteError as exc:
            out.allowed = False
            reply(conn, out, exc.status, exc.detail, req)
            return
        out.allowed = True
        body = req.body
        assert body is not None
        limit = settings.max_body_bytes
        if limit and req.content_length is not None and req.content_length > limit:
            reply(conn, out, 413, "Request body too large.", req)
            return
        timeout = (
            settings.proxy_timeout if route.timeout is None else min(route.timeout, settings.proxy_timeout)
        )
        # A client that states how long it will wait (X-Sandbox-Timeout) also waits that long for headers.
        header_timeout = settings.response_header_timeout if route.timeout is None else timeout
        suspending = False
        if self.lifecycle is not None:
            try:
                # Ours: a request naming another sandbox's address or UID is refused before it counts as
                # activity (until December 6 it kept the named Sandbox from its idle suspend).
                self.resolver.refuse_named_elsewhere(route, held=False)
            except RouteError as exc:
                reply(conn, out, exc.status, exc.detail, req)
                return
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
                reply(conn, out, 429, f"Too many concurrent WebSocket connections (limit: {limit}).", req)
                return
        try:
            await self._forward(conn, req, route, out, start, timeout, header_timeout, span, suspending)
        finally:
            if req.upgrade:
                self.tunnel_limits.release(client_key)

    async def _hold(
        self,
        conn: ClientConnection,
        out: Outcome,
        req: Request,
        route: Route,
        deadline: float,
        failed: PodEntry | None,
        *,
        leaving: bool = False,
    ) -> bool | None:
        """Ours: hold the request while its Sandbox resumes (`RouterLifecycle.hold`).

        Returns True when a Ready pod is there (dial again), False when this Sandbox is not held, None when
        it cannot resume and the 503 was sent.
        """
        assert self.lifecycle is not None
        try:
            return await self.lifecycle.hold(route, deadline, failed, leaving=leaving)
        except ResumeFailed as refused:
            retry_after = b"Retry-After: %d\r\n" % RETRY_AFTER
            reply(conn, out, refused.status, refused.detail, req, extra=retry_after)
            return None

    def _dialled(self, route: Route, target: Target) -> PodEntry | None:
        """The Pod cache's entry for the pod `target` dialled: its own, or for a target resolved without the
        cache (`X-Sandbox-Pod-IP`, DNS) the Sandbox's current pod when it has that address - so a hold waits
        for another pod (or that one's container restarted), not for the draining one it would find Ready
        at once (the request then went back to it)."""
        if target.entry is not None:
            return target.entry
        assert self.lifecycle is not None
        now = self.lifecycle.current_pod(route)
        return now if now is not None and now.ip == target.host else None

    def _replaced(self, route: Route, target: Target) -> bool:
        """The Sandbox has another pod than the one that closed the request's connection unanswered.

        Only then is the request sent again: a draining pod closes the connections it has not read; the
        same pod with its container restarted may have run the request before dying. Only requests that may
        run twice get here (`Exchange.upstream_failed`); a runtime's explicit "not started" does not need it.
        """
        assert self.lifecycle is not None
        now = self.lifecycle.current_pod(route)
        return now is not None and (target.entry is None or now.pod_uid != target.entry.pod_uid)

    async def _forward(
        self,
        conn: ClientConnection,
        req: Request,
        route: Route,
        out: Outcome,
        start: float,
        limit: float,
        header_timeout: float,
        span: Any,
        suspending: bool = False,
    ) -> None:
        """Resolve, dial (with retries and holds) and relay. Reaching the sandbox must fit in `limit` seconds
        from `start`; the exchange then gets `limit` as its idle limit."""
        settings = self.settings
        loop = asyncio.get_running_loop()
        deadline = start + limit
        resolver = self.resolver
        body = req.body
        assert body is not None
        delay = settings.retry_initial
        retries = 0
        holds = 0
        fresh = False
        # Ours: held while the Sandbox resumed, so an `X-Sandbox-Pod-IP` the request carries predates the resume
        # and it is resolved by name (`Resolver.resolve_fast`).
        resumed = False
        if self.lifecycle is not None and (suspending or self.lifecycle.seen_suspended(route)):
            try:
                # Ours: what resolving after the hold would refuse (another sandbox's address or UID) is refused
                # first, without resuming anything (until December 6 the Sandbox was resumed, then 403).
                resolver.refuse_named_elsewhere(route)
            except RouteError as exc:
                reply(conn, out, exc.status, exc.detail, req)
                return
            # Ours: not to the pod a suspend is taking away; held for the resumed one. Whether the activity write
            # found the Sandbox just suspended or this router saw it Suspended, the pod there now is the one
            # going, even while its deletion is not in the Pod cache yet (until December 5 a Sandbox seen
            # Suspended took that pod for the resumed one, and the request's command died with it: CI's
            # `test_requests_around_the_controllers_idle_suspend_are_all_served`). A stale view (resumed
            # already) soon shows the Sandbox Running and Ready, and then that pod serves.
            holds += 1
            leaving = self.lifecycle.current_pod(route)
            held = await self._hold(conn, out, req, route, deadline, leaving, leaving=True)
            if held is None:
                return
            resumed = held
        while True:
            target: Target | None = None
            # Which timer a TimeoutError came from: the request's deadline (504) or the dial timeout (502).
            resolving: asyncio.Timeout | None = None
            dial_bounded_by_deadline = False
            try:
                target = resolver.resolve_fast(route, resumed=resumed)
                if target is None:
                    resolving = asyncio.timeout_at(deadline)
                    async with resolving:
                        target = await resolver.resolve(route, resumed=resumed)
                upstream = None if fresh else self.pool.take((target.host, target.port))
                self.metrics.admit_namespace(route.namespace)  # resolved: a sandbox of that namespace
                if upstream is None:
                    # `UpstreamPool.dial` stops at the earlier of `deadline` and its dial timeout from now.
                    dial_bounded_by_deadline = deadline <= loop.time() + self.pool.dial_timeout
                    upstream = await self.pool.dial(target.host, target.port, deadline=deadline)
            except RouteError as exc:
                reply(conn, out, exc.status, exc.detail, req)
                return
            except (OSError, TimeoutError) as exc:
                if isinstance(exc, OSError) and self.out_of_descriptors(route.namespace, exc):
                    # Ours: upstream's router answers 502 `Could not connect` after its retries; the sandbox is
                    # fine, the router is out of descriptors: 503 with Retry-After, at once.
                    reply(conn, out, 503, EXHAUSTED_DETAIL, req, extra=b"Retry-After: 1\r\n")
                    return
                timed_out = isinstance(exc, TimeoutError)
                # The request's time ran out (504, no hold, no retry), known from the timer that fired and not
                # only from the clock: under uvloop the loop clock counts whole milliseconds and is read once
                # per loop iteration, so a timer set for a deadline under a millisecond away (an SDK call's
                # `timeout=1e-4` as X-Sandbox-Timeout) fires with `loop.time()` still short of it; until
                # December 7 such a dial to a healthy sandbox was answered 502 `Could not connect`, which
                # the SDK takes for an unreachable sandbox (retries, then a Sandbox read: ~16 s).
                expired = loop.time() >= deadline or (
                    timed_out
                    and (dial_bounded_by_deadline or (resolving is not None and resolving.expired()))
                )
                host_dead = timed_out or getattr(exc, "errno", None) in _HOST_DEAD
                if (
                    host_dead
                    and target is not None
                    and target.source in ("cache", "cache-name")
                    and resolver.invalidate(target, by_uid=target.source == "cache")
                ):
                    self.metrics.cache_invalidation(route.namespace)
                if self.lifecycle is not None and holds < MAX_HOLDS and not expired:
                    # Ours: a Sandbox that resumes on request is resumed (or waited for) instead of failing.
                    holds += 1
                    held = await self._hold(conn, out, req, route, deadline, target.entry if target else None)
                    if held is None:
                        return
                    if held:
                        retries, delay, resumed = 0, settings.retry_initial, True
                        continue
                if retries < settings.max_retries and not expired and loop.time() + delay < deadline:
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
                self._not_reached(conn, out, req, route, limit, expired)
                return
            if span is not None and self.propagator is not None:
                span.set_attribute("sandbox.upstream_source", target.source)
            exchange = Exchange(self, conn, req, route, out, upstream, target)
            lifecycle = self.lifecycle
            if lifecycle is None:
                result = await exchange.run(limit, header_timeout, span)
            else:
                # Ours: a request is activity until its response head (a slow command), then while its bytes
                # move (a long download), not while it is held open in silence (an EventSource).
                lifecycle.watch(route.namespace, route.sandbox_id, exchange)
                try:
                    # Only for a Sandbox the lifecycle holds: any other's answers and failures go as without
                    # the flag (a draining runtime's 503 relayed as it is, not replaced by the router's own).
                    holdable = holds < MAX_HOLDS and lifecycle.resumable(route.namespace, route.sandbox_id)
                    result = await exchange.run(limit, header_timeout, span, unanswered_ok=holdable)
                finally:
                    lifecycle.unwatch(route.namespace, route.sandbox_id, exchange)
            if result == "retry":
                if not fresh and body.rewind():
                    fresh = True
                    continue
                self.metrics.upstream_error(route.namespace, "eof")
                self._not_reached(conn, out, req, route, limit, loop.time() >= deadline)
                return
            if result in ("refused", "unanswered"):
                # Ours: the pod is going away (a suspend racing the request). "refused": the draining runtime
                # answered that it did not start it (`X-Sandbox-Not-Started`) - nothing of it ran, so it is
                # sent whole to the pod (or restarted container) the hold waited for, whatever its method.
                # "unanswered": a fresh connection closed before any response byte, as a refused dial - only a
                # request that may run twice (GET, HEAD, OPTIONS, TRACE, an idempotency key:
                # `Exchange.upstream_failed`) gets here, and it goes only to another pod (`_replaced`): the
                # same one's restarted container may have run it. Not once the request's time is up: the hold
                # would answer 503 "not Ready within 0s" (nothing to wait for), the dial 504.
                if loop.time() < deadline:
                    holds += 1
                    held = await self._hold(conn, out, req, route, deadline, self._dialled(route, target))
                    if held is None:
                        return
                    if held and (result == "refused" or self._replaced(route, target)) and body.rewind():
                        retries, delay, fresh, resumed = 0, settings.retry_initial, False, True
                        continue
                if result == "refused" and loop.time() < deadline:
                    reply(conn, out, 503, not_started_error(route), req, extra=b"Retry-After: 1\r\n")
                    return
                if result == "unanswered":
                    self.metrics.upstream_error(route.namespace, "eof")
                self._not_reached(conn, out, req, route, limit, loop.time() >= deadline)
                return
            if result == "upgraded":
                await self._tunnel(conn, req, route, out, exchange)
            return

    def _not_reached(
        self, conn: ClientConnection, out: Outcome, req: Request, route: Route, limit: float, expired: bool
    ) -> None:
        """Answer a request that never got a connection that answered: 504 when its time (`limit`) ran out,
        whatever the last attempt's error, else upstream's 502 `Could not connect` (router spec §1.6)."""
        if expired:
            detail = timeout_error(
                route, "no connection within", limit, self.settings.proxy_timeout, "--proxy-timeout"
            )
            reply(conn, out, 504, detail, req)
        else:
            reply(conn, out, 502, connect_error(route), req)

    async def _tunnel(
        self, conn: ClientConnection, req: Request, route: Route, out: Outcome, exchange: Exchange
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
        if self.lifecycle is not None:
            self.lifecycle.watch(route.namespace, route.sandbox_id, tunnel)
        try:
            await tunnel.run()
        finally:
            self.tunnels.discard(tunnel)
            if self.lifecycle is not None:
                self.lifecycle.unwatch(route.namespace, route.sandbox_id, tunnel)
            out.bytes_out += tunnel.bytes_to_client
