"""The router process: start-up order, listeners, probes, drain on SIGTERM (router spec §1.12).

Start-up: tracing -> metrics -> TLS -> Kubernetes client (only for the cache or tokenreview) -> Pod cache
initial sync (60 s, else `pod cache failed initial sync ...`) -> authorizer -> bind every listener (a bind
failure aborts before readiness) -> ready. Probes: `/healthz` -> 200 `{"status":"ok"}`; `/readyz` -> 200
`ok` when ready, 503 `draining` otherwise. Shutdown: unready, stop accepting, let in-flight requests
finish (keep-alive connections close after their current response; h2c connections get a GOAWAY and close
once their streams end; upgraded connections run on) until `stop_reserve` before `--shutdown-timeout`, then
cut what is left and stop, done by the timeout.

`Router` is also the in-process API tests and the dev cluster use: `await router.start()`, the bound
ports, `await router.shutdown()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from ..api.kinds import SANDBOX
from ..kube import ApiClient, Object, Tracing, load_config, setup_tracing
from ..kube._servers import HttpServer, MetricsServer, parse_bind_address
from ._authz import AllowAll, Authorizer, ScopedToken, TokenReview
from ._config import RouterConfig, read_scoped_secret
from ._lifecycle import RouterLifecycle
from ._lifecycle_state import SYNC_ERROR as LIFECYCLE_SYNC_ERROR
from ._lifecycle_state import LifecycleState
from ._metrics import RouterMetrics
from ._podcache import INITIAL_SYNC_ERROR, PodCache
from ._proxy import Proxy, ProxySettings
from ._resolve import ClaimedCheck, Resolver
from ._server import ClientConnection, ConnectionLimits, DeadlineSweeper
from ._tls import ReloadingTLS
from ._tunnel import TunnelLimits
from ._upstream import UpstreamPool

__all__ = ["CACHE_SYNC_TIMEOUT", "Router", "StartupError", "stop_reserve"]

log = logging.getLogger("agent_sandbox.router")

CACHE_SYNC_TIMEOUT = 60.0
SERVICE_NAME = "sandbox-router"


def stop_reserve(shutdown_timeout: float) -> float:
    """Seconds of `--shutdown-timeout` kept for stopping after the drain: a fifth of it, at most 1 s.

    The router must be gone by the timeout (at the default 30 s, the kubelet's default grace period): the
    drain ends this much earlier, so cutting what is left, flushing spans and exiting fit in the timeout.
    """
    return min(1.0, max(0.0, shutdown_timeout) / 5)


class StartupError(RuntimeError):
    """The router could not start (exit status 1)."""


class Router:
    """One router process's listeners and components."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        kube_client: ApiClient | None = None,
        tracing: Tracing | None = None,
        reuse_port: bool = False,
        metrics_view: Callable[[CollectorRegistry], CollectorRegistry] | None = None,
        extra_ready: Callable[[], bool] | None = None,
    ) -> None:
        """Args:
        config: the settings.
        kube_client: API client to use (default: built from `--kubeconfig` when the cache or
            tokenreview needs one; a given client is not closed by the router).
        tracing: an already set-up tracer (default: from `--enable-tracing`).
        reuse_port: bind the proxy listeners with SO_REUSEPORT (`--workers`).
        metrics_view: maps the router's registry to the one `/metrics` serves (`--workers`: merged).
        extra_ready: a further readiness condition for `/readyz` (`--workers`: every worker serving).
        """
        self.config = config
        self._reuse_port = reuse_port or config.workers > 1
        self._metrics_view = metrics_view
        self._extra_ready = extra_ready
        self.metrics = RouterMetrics()
        self.ready = False
        self.http_port: int | None = None
        self.https_port: int | None = None
        self.connections: set[ClientConnection] = set()
        self.cache: PodCache | None = None
        self.proxy: Proxy | None = None
        self.lifecycle: RouterLifecycle | None = None
        self.tls: ReloadingTLS | None = None
        self._kube = kube_client
        self._owns_kube = kube_client is None
        self._servers: list[asyncio.Server] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._http_servers: list[HttpServer] = []
        self._given_tracing = tracing
        self._tracing = tracing or setup_tracing(False)

    # ------------------------------------------------------------------ ports of the side listeners

    @property
    def metrics_port(self) -> int | None:
        return self._http_servers[0].port if self._http_servers else None

    @property
    def probe_port(self) -> int | None:
        return self._http_servers[1].port if len(self._http_servers) > 1 else None

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        """Build every component and bind every listener, in upstream's order; then mark ready.

        Raises:
            StartupError: a component failed (message says which); nothing is left running.
        """
        try:
            await self._start()
        except BaseException:
            await self._stop_everything()
            raise

    async def _start(self) -> None:
        config = self.config
        if self._given_tracing is None:
            self._tracing = setup_tracing(config.enable_tracing, service_name=SERVICE_NAME)
        if config.enable_otel_metrics:
            # Not silently: the flag (or an OTLP endpoint variable) asked for a push we do not do.
            log.warning(
                "--enable-otel-metrics: pushing metrics over OTLP is not implemented; "
                "scrape /metrics on --metrics-bind-address instead"
            )
        if config.https_bind_address:
            try:
                self.tls = ReloadingTLS(
                    config.tls_cert_file,
                    config.tls_key_file,
                    client_ca_file=config.tls_client_ca_file,
                    mtls_mode=config.mtls_mode,
                    on_reload=self.metrics.cert_reload,
                )
            except (OSError, ValueError) as exc:
                raise StartupError(f"TLS: {exc}") from exc
        if config.needs_kube and self._kube is None:
            self._kube = ApiClient(load_config(config.kubeconfig or None), qps=-1)
        if config.cache_enabled:
            assert self._kube is not None
            self.cache = PodCache(self._kube, namespace=config.cache_namespace or None)
            self._tasks.append(asyncio.create_task(self.cache.run(), name="pod-cache"))
            try:
                async with asyncio.timeout(CACHE_SYNC_TIMEOUT):
                    await self.cache.wait_synced()
            except TimeoutError:
                raise StartupError(INITIAL_SYNC_ERROR) from None
        if config.sandbox_lifecycle:
            assert self._kube is not None
            assert self.cache is not None
            await self._start_lifecycle(self._kube, self.cache)
        authorizer = self._authorizer()
        claimed = None
        if self.cache is not None and self._kube is not None:
            kube = self._kube

            async def get_sandbox(namespace: str, name: str) -> Object:
                return await kube.get(SANDBOX, name, namespace=namespace)

            claimed = ClaimedCheck(get_sandbox)
        resolver = Resolver(
            cluster_domain=config.cluster_domain,
            allow_loopback=config.allow_loopback_pod_ip,
            cache=self.cache,
            claimed=claimed,
            resumable=self.lifecycle.resumable if self.lifecycle is not None else None,
        )
        self.proxy = Proxy(
            ProxySettings(
                proxy_timeout=config.proxy_timeout,
                response_header_timeout=config.response_header_timeout,
                max_retries=config.upstream_max_retries,
                retry_initial=config.upstream_retry_initial_delay,
                retry_max=config.upstream_retry_max_delay,
                allow_loopback=config.allow_loopback_pod_ip,
                max_body_bytes=config.max_request_body_bytes,
                max_concurrent=config.max_concurrent_requests,
            ),
            resolver=resolver,
            authorizer=authorizer,
            metrics=self.metrics,
            pool=UpstreamPool(),
            tunnel_limits=TunnelLimits(
                idle_timeout=config.websocket_idle_timeout,
                max_lifetime=config.websocket_max_lifetime,
                max_per_client=config.websocket_max_connections_per_client,
                max_message_bytes=config.websocket_max_message_bytes,
                trusted_proxies=config.trusted_proxy_cidrs,
            ),
            access_log_enabled=config.access_log,
            tracer=self._tracing.tracer,
            propagator=self._tracing.propagator,
            lifecycle=self.lifecycle,
        )
        await self._bind_all()
        self._tasks.append(asyncio.create_task(DeadlineSweeper(self.connections).run(), name="deadlines"))
        if self.tls is not None:
            self._tasks.append(asyncio.create_task(self.tls.watch(), name="tls-reload"))
        self.ready = True
        log.info(
            "sandbox router ready",
            extra={"http_port": self.http_port, "https_port": self.https_port, "cache": config.cache_enabled},
        )

    async def _start_lifecycle(self, kube: ApiClient, cache: PodCache) -> None:
        """Sandbox/template/archive state (synced like the Pod cache) and the activity writer."""
        config = self.config
        state = LifecycleState(kube, namespace=config.cache_namespace or None)
        self._tasks.append(asyncio.create_task(state.run(), name="lifecycle-state"))
        try:
            async with asyncio.timeout(CACHE_SYNC_TIMEOUT):
                await state.wait_synced()
        except TimeoutError:
            raise StartupError(LIFECYCLE_SYNC_ERROR) from None
        self.lifecycle = RouterLifecycle(
            kube,
            state,
            cache,
            self.metrics,
            resume_timeout=config.sandbox_lifecycle_resume_timeout,
            activity_interval=config.sandbox_lifecycle_activity_interval,
        )
        self._tasks.append(asyncio.create_task(self.lifecycle.run(), name="lifecycle-activity"))

    def _authorizer(self) -> Authorizer:
        config = self.config
        if config.authz_mode == "tokenreview":
            assert self._kube is not None
            return TokenReview(
                self._kube,
                audiences=config.authz_tokenreview_audiences,
                ttl=config.authz_tokenreview_ttl,
                cache_size=config.authz_tokenreview_cache_size,
                require_token=config.authz_tokenreview_require_token,
            )
        if config.authz_mode == "scoped-token":
            return ScopedToken(read_scoped_secret(config.authz_scoped_token_secret_file))
        return AllowAll()

    async def _bind_all(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        proxy = self.proxy
        assert proxy is not None
        limits = ConnectionLimits(
            max_header_bytes=config.max_request_header_bytes,
            max_body_bytes=config.max_request_body_bytes,
            read_header_timeout=config.read_header_timeout,
            idle_timeout=config.idle_timeout,
            fd_guard=proxy.fd_guard,
        )
        if config.enable_h2c:
            from ._h2c import H2cPassThrough

            limits.h2c = H2cPassThrough(proxy).take_over
        registry = self.connections
        reuse_port = self._reuse_port
        for address, scheme in ((config.http_bind_address, "http"), (config.https_bind_address, "https")):
            bind = parse_bind_address(address)
            if bind is None:
                continue
            ssl_ctx = self.tls.context if scheme == "https" and self.tls is not None else None

            def factory(scheme: str = scheme) -> ClientConnection:
                return ClientConnection(
                    proxy,
                    limits,
                    scheme=scheme,
                    registry=registry,
                    client_cert_required=scheme == "https" and config.mtls_mode == "required",
                )

            try:
                server = await loop.create_server(
                    factory,
                    bind[0],
                    bind[1],
                    ssl=ssl_ctx,
                    backlog=4096,
                    reuse_address=True,
                    reuse_port=reuse_port or None,
                    ssl_handshake_timeout=config.read_header_timeout if ssl_ctx else None,
                )
            except OSError as exc:
                raise StartupError(f"bind {scheme} listener {address}: {exc.strerror or exc}") from exc
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            if scheme == "http":
                self.http_port = port
            else:
                self.https_port = port
        served = self._metrics_view(self.metrics.registry) if self._metrics_view else self.metrics.registry
        # The side listeners get the proxy listener's header deadline: a client that opens connections and
        # never finishes a request head must not hold them (and the router's descriptors) forever.
        header_timeout = config.read_header_timeout
        metrics = MetricsServer(config.metrics_bind_address, served, header_timeout=header_timeout)
        probes = HttpServer(
            "health probe", config.health_probe_bind_address, self._probe_app(), header_timeout=header_timeout
        )
        self._http_servers = [metrics, probes]
        for server_ in self._http_servers:
            task = asyncio.create_task(server_.start(), name=server_.name)
            self._tasks.append(task)
            waiter = asyncio.create_task(server_.wait_serving())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                waiter.cancel()
                error = task.exception()
                raise StartupError(f"bind {server_.name} listener {server_.address}: {error}") from error

    def _probe_app(self) -> web.Application:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(body=b'{"status":"ok"}', content_type="application/json")

        async def readyz(_: web.Request) -> web.Response:
            if self.ready and (self._extra_ready is None or self._extra_ready()):
                return web.Response(text="ok")
            return web.Response(status=503, text="draining")

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        return app

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self) -> None:
        """Drain (router spec §1.12): unready, stop accepting, finish in-flight requests, then stop; returns
        within `--shutdown-timeout` (requests still running `stop_reserve` before it are cut)."""
        self.ready = False
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.start_drain()
        loop = asyncio.get_running_loop()
        timeout = self.config.shutdown_timeout
        end = loop.time() + timeout
        reserve = stop_reserve(timeout)
        while self._busy() and loop.time() < end - reserve:  # noqa: ASYNC110 - polls connection states
            await asyncio.sleep(0.05)
        if self._busy():
            log.warning("shutdown timeout: closing %d connection(s) still busy", len(self.connections))
            if self.proxy is not None:
                # WebSockets get a close frame (1001) each way before the cut, where a frame boundary allows
                # (`Tunnel.going_away`): clients then see a server going away, not an abnormal closure.
                tunnels = list(self.proxy.tunnels)
                for tunnel in tunnels:
                    tunnel.going_away()
                # Their closing handshakes (RFC 6455 7.1.1: a browser reports a close whose connection went
                # before its answer as not clean), for a quarter of the reserve at most: an end that
                # answers does so within a round trip; the span flush keeps its own quarter after.
                ending = [t.ended for t in tunnels if t.ended is not None and not t.ended.done()]
                if ending:
                    await asyncio.wait(ending, timeout=max(0.0, end - reserve * 3 / 4 - loop.time()))
                for tunnel in tunnels:
                    tunnel.close_now()
        await self._stop_everything(flush_until=end - reserve / 2)

    def _busy(self) -> bool:
        # Upgraded connections (WebSocket, Upgrade tunnels) and h2c ones hold the drain up too, until they
        # end or the drain's deadline cuts them: Go's Shutdown does not wait for hijacked connections, and
        # until December 7 neither did this, so every gRPC stream and WebSocket through a router was cut
        # at each rollout (docs/router.md, "SIGTERM with h2c streams or tunnels open").
        return any(not c.idle for c in self.connections if not c.closed)

    async def _stop_everything(self, flush_until: float | None = None) -> None:
        """Stop every component; `flush_until` (loop time) bounds the wait for queued spans to be exported."""
        self.ready = False
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.abort()
        if self.proxy is not None:
            self.proxy.pool.close_all()
            await self._settle_cut_handlers(flush_until)
            if self.proxy.access_log is not None:
                # The batched access log's flush timer would fire after the process is gone: write it now,
                # once the cut requests (499) are in it.
                self.proxy.access_log.flush()
        if self.lifecycle is not None:
            await self.lifecycle.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._servers.clear()
        if self._kube is not None and self._owns_kube:
            await self._kube.close()
        if self._given_tracing is None:
            await self._shutdown_tracing(flush_until)

    async def _settle_cut_handlers(self, until: float | None) -> None:
        """Let the handlers of the requests just cut see their cancellation (the aborted connections are lost
        on the next loop turns) and count and log them, for a quarter of a second at most (and not past
        `until`): until December 7 their access-log lines went into the batch after the last flush and were
        lost with the process."""
        loop = asyncio.get_running_loop()
        end = loop.time() + 0.25 if until is None else min(loop.time() + 0.25, until)
        while self.proxy is not None and self.proxy.inflight and loop.time() < end:  # noqa: ASYNC110
            await asyncio.sleep(0.005)

    async def _shutdown_tracing(self, until: float | None) -> None:
        if until is None:
            self._tracing.shutdown()
            return
        # The exporter flushes queued spans synchronously, retrying for up to its 10 s timeout when the
        # collector does not answer: in a daemon thread, waited for only until `until`, so a collector that
        # is down cannot hold the stop past `--shutdown-timeout` (nor block the loop meanwhile).
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finished() -> None:
            if not done.done():
                done.set_result(None)

        def flush() -> None:
            try:
                self._tracing.shutdown()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(finished)

        threading.Thread(target=flush, name="trace-flush", daemon=True).start()
        flushed, _ = await asyncio.wait({done}, timeout=max(0.1, until - loop.time()))
        if not flushed:
            done.cancel()
            log.warning(
                "trace export did not finish before --shutdown-timeout: dropping the spans still queued"
            )
