"""The two plain-HTTP servers of the manager: metrics (`/metrics`, optional pprof) and probes.

Owns: bind-address parsing with Go semantics (":8080" = all interfaces, "host:port", "0" = disabled,
port 0 = any free port), serving the Prometheus registry, and `/healthz` + `/readyz` with named checks
(controller-runtime `healthz.Ping` by default: OK once the process serves; controllers spec §5.4).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..api.errortext import describe_error

__all__ = ["Check", "HealthServer", "HttpServer", "MetricsServer", "parse_bind_address"]

log = logging.getLogger("agent_sandbox.kube.servers")

Check = Callable[[], bool | Awaitable[bool]]


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

    def __init__(self, name: str, address: str, app: web.Application) -> None:
        self.name = name
        self.address = address
        self.app = app
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
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, bind[0], bind[1], reuse_address=True)
            await site.start()
            server = site._server
            sockets = getattr(server, "sockets", None) or []
            self.port = sockets[0].getsockname()[1] if sockets else bind[1]
            log.info("serving %s", self.name, extra={"address": self.address, "port": self.port})
            self._ready.set()
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()


class MetricsServer(HttpServer):
    """Serves `registry` at /metrics (plus pprof routes when enabled)."""

    def __init__(self, address: str, registry: CollectorRegistry) -> None:
        app = web.Application()
        self.registry = registry

        async def metrics(_: web.Request) -> web.Response:
            # Collection walks every metric; off-loop would need locks in collectors, and it takes ~ms.
            body = generate_latest(registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/metrics", metrics)
        super().__init__("metrics", address, app)


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
