"""The two plain-HTTP servers of the manager: metrics (`/metrics`, optional pprof) and probes.

Owns: bind-address parsing with Go semantics (":8080" = all interfaces, "host:port", "0" = disabled,
port 0 = any free port), serving the Prometheus registry, and `/healthz` + `/readyz` with named checks
(controller-runtime `healthz.Ping` by default: OK once the process serves; controllers spec §5.4).

Both listeners bound what a client can hold: a connection that has not sent a complete request head within
`header_timeout` seconds (from its accept, or from the end of its previous response) is closed, and past
`max_connections` open connections a new one is closed at once. Until December 6 neither was bounded: 237
connections that sent half a request head stayed open for good and, on the router, took the descriptors
its proxy listener needed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..api.errortext import describe_error

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "Check",
    "HealthServer",
    "HttpServer",
    "MetricsServer",
    "parse_bind_address",
]

log = logging.getLogger("agent_sandbox.kube.servers")

Check = Callable[[], bool | Awaitable[bool]]

DEFAULT_HEADER_TIMEOUT = 10.0
"""Seconds a connection may take to send a request head (Go's servers commonly set ReadHeaderTimeout so)."""
DEFAULT_MAX_CONNECTIONS = 128
"""Open connections per listener: scrapers and kubelet probes need a handful."""
SHUTDOWN_GRACE = 2.0
"""Seconds a stopping listener waits for its requests in flight (then aiohttp cancels their handlers, and waits
as long again for one that ignores that). Its default (60 s) let one client that left a request body
half-sent hold the whole controller's stop past the kubelet's 30 s grace."""


class _Refused(asyncio.Protocol):
    """A connection over the cap: closed as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def parse_bind_address(addr: str) -> tuple[str | None, int] | None:
    """Parse a Go listen address. Returns None for disabled ("" or "0"), else (host or None=all, port).

    Raises:
        ValueError: not "[host]:port" with a numeric port.
    """
    if addr in ("", "0"):
        return None
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid bind address {addr!r}: want [host]:port")
    host = host.strip("[]")
    return (host or None, int(port))


class HttpServer:
    """An aiohttp application bound to one address; `start()` serves until cancelled."""

    need_leader_election = False

    def __init__(
        self,
        name: str,
        address: str,
        app: web.Application,
        *,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        """Args:
        name: for logs.
        address: Go-style bind address ("0" or "" disables the server).
        app: what to serve.
        header_timeout: seconds a connection may take to send a complete request head (and may stay idle
            between requests) before it is closed.
        max_connections: connections open at once; more are closed as soon as they are accepted.
        """
        self.name = name
        self.address = address
        self.app = app
        self.header_timeout = header_timeout if header_timeout > 0 else DEFAULT_HEADER_TIMEOUT
        self.max_connections = max_connections
        self.port: int | None = None
        self._ready = asyncio.Event()

    async def wait_serving(self) -> None:
        """Return once the socket is bound (immediately if disabled)."""
        await self._ready.wait()

    async def start(self) -> None:
        bind = parse_bind_address(self.address)
        if bind is None:
            log.info("%s server disabled", self.name)
            self._ready.set()
            await asyncio.Event().wait()
            return
        # aiohttp arms its keep-alive timer at accept and after each response, and closes a connection still
        # waiting for a request head when it fires: with it set to the header timeout, that is the header
        # deadline (aiohttp has no other), and the idle keep-alive limit too.
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.header_timeout,
            shutdown_timeout=SHUTDOWN_GRACE,
        )
        await runner.setup()
        listener: asyncio.Server | None = None
        try:
            handlers = runner.server
            assert handlers is not None
            cap = self.max_connections

            def factory() -> asyncio.Protocol:
                if cap > 0 and len(handlers.connections) >= cap:
                    return _Refused()
                return handlers()

            listener = await asyncio.get_running_loop().create_server(
                factory, bind[0], bind[1], reuse_address=True
            )
            self.port = listener.sockets[0].getsockname()[1] if listener.sockets else bind[1]
            log.info("serving %s", self.name, extra={"address": self.address, "port": self.port})
            self._ready.set()
            await asyncio.Event().wait()
        finally:
            if listener is not None:
                listener.close()
            await runner.cleanup()


class MetricsServer(HttpServer):
    """Serves `registry` at /metrics (plus pprof routes when enabled)."""

    def __init__(
        self, address: str, registry: CollectorRegistry, *, header_timeout: float = DEFAULT_HEADER_TIMEOUT
    ) -> None:
        app = web.Application()
        self.registry = registry

        async def metrics(_: web.Request) -> web.Response:
            # Collection walks every metric; off-loop would need locks in collectors, and it takes ~ms.
            body = generate_latest(registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/metrics", metrics)
        super().__init__("metrics", address, app, header_timeout=header_timeout)


class HealthServer(HttpServer):
    """Serves /healthz and /readyz from named checks: by default a ping each, named `healthz` and `readyz` as
    upstream's manager names them (`/readyz/readyz`, `?verbose`; they were `ping` until December 6)."""

    def __init__(self, address: str) -> None:
        self.healthz: dict[str, Check] = {"healthz": lambda: True}
        self.readyz: dict[str, Check] = {"readyz": lambda: True}
        app = web.Application()
        app.router.add_get("/healthz", self._handler(self.healthz))
        app.router.add_get("/healthz/{check}", self._handler(self.healthz))
        app.router.add_get("/readyz", self._handler(self.readyz))
        app.router.add_get("/readyz/{check}", self._handler(self.readyz))
        super().__init__("health probe", address, app)

    @staticmethod
    def _handler(checks: dict[str, Check]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            only = request.match_info.get("check")
            if only is not None and only not in checks:
                return web.Response(status=404, text=f"no check {only!r}\n")
            lines, ok = [], True
            for name, check in checks.items():
                if only is not None and name != only:
                    continue
                try:
                    result = check()
                    passed = bool(await result) if inspect.isawaitable(result) else bool(result)
                except Exception as exc:
                    passed = False
                    log.warning("health check %s failed: %s", name, describe_error(exc))
                ok &= passed
                lines.append(f"[{'+' if passed else '-'}]{name} {'ok' if passed else 'failed'}")
            if ok and "verbose" not in request.query:
                return web.Response(text="ok")
            body = "\n".join(lines) + ("\nhealthz check passed\n" if ok else "\nhealthz check failed\n")
            return web.Response(status=200 if ok else 500, text=body)

        return handle
