"""One runtime server: the legacy HTTP, sandboxd REST and gRPC listeners of one sandbox, on one event loop.

Reusable: the console script runs one; the dev cluster's local runner runs one per pod IP in a single
process (each with its own root, limits and processes). Every listener is bound by the server itself, so a
handler always knows which sandbox a request is for. One grpc.aio server per runtime server (not one
server with many bound addresses): grpcio cannot add ports once started and pods come and go; measured
cost about 15 KB and no thread per server (docs/design/runtime-grpc-per-server.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from aiohttp import web
from grpc import aio

from agent_sandbox.api import processv1

from ._http import JsonErrorAppRunner
from .config import RuntimeConfig
from .grpc_service import add_process_service
from .legacy import legacy_app
from .reflection import enable_reflection
from .rest import rest_app
from .state import RuntimeState

__all__ = ["RuntimeServer"]

log = logging.getLogger(__name__)

#: Longest request line or header field the HTTP listeners read.
MAX_HEAD_LINE = 64 << 10
_CHILD_GRACE = 2.0  # spec §2.2: children get SIGTERM, SIGKILL after 2 s (or the shutdown deadline)


class RuntimeServer:
    """Serve one sandbox: `await start()`, read `ports`, `await stop()` (drains like sandboxd on SIGTERM)."""

    def __init__(self, config: RuntimeConfig) -> None:
        config.validate()
        self.config = config
        self.state = RuntimeState(config)
        self._runners: list[tuple[str, web.AppRunner]] = []
        self._grpc: aio.Server | None = None
        self.ports: dict[str, int] = {}
        self._stopped = asyncio.Event()

    @property
    def root(self) -> str:
        return self.state.root

    async def start(self) -> None:
        """Bind and serve all three listeners (OSError when a port is taken; nothing stays bound then)."""
        try:
            await self._start_http("legacy", legacy_app(self.state), self.config.legacy_port)
            await self._start_http("rest", rest_app(self.state), self.config.rest_port)
            await self._start_grpc()
        except BaseException:
            await self._close_listeners(0)
            raise
        # The container's log (`kubectl logs`): the dev cluster's runner routes it to the pod's log file.
        log.info(
            "serving %s on %s: legacy %d, rest %d, grpc %d",
            self.config.client_root or self.root,
            self.config.listen_host,
            self.ports["legacy"],
            self.ports["rest"],
            self.ports["grpc"],
        )

    async def _start_http(self, name: str, app: web.Application, port: int) -> None:
        runner = JsonErrorAppRunner(
            app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=self.config.http_idle_timeout,
            shutdown_timeout=self.config.shutdown_timeout,
            handler_cancellation=True,  # a client that goes away cancels its command
            # A path is in the request line, percent-encoded: a legal one (PATH_MAX 4096 bytes, non-ASCII
            # names 3 characters per byte) needs up to ~12 KiB, past aiohttp's default of 8190. Upstream's
            # runtimes take 16 KiB (uvicorn) and 1 MiB (Go) of head.
            max_line_size=MAX_HEAD_LINE,
            max_field_size=MAX_HEAD_LINE,
        )
        await runner.setup()
        self._runners.append((name, runner))
        sock = _bind(self.config.listen_host, port)
        site = web.SockSite(runner, sock)
        await site.start()
        self.ports[name] = sock.getsockname()[1]

    async def _start_grpc(self) -> None:
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        add_process_service(server, self.state)
        # v1 and v1alpha, as grpc-go's reflection.Register in sandboxd (v1-only clients exist).
        enable_reflection(server, (processv1.SERVICE,))
        self._grpc = server
        port = server.add_insecure_port(_host_port(self.config.listen_host, self.config.grpc_port))
        if port == 0:
            raise OSError(f"cannot bind gRPC to {self.config.listen_host}:{self.config.grpc_port}")
        await server.start()
        self.ports["grpc"] = port

    @property
    def draining(self) -> bool:
        return self.state.draining

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health 503, children SIGTERM then SIGKILL after 2 s, HTTP drains, gRPC stops (forced at the deadline)."""
        if self._stopped.is_set():
            return
        deadline = self.config.shutdown_timeout if grace is None else grace
        log.info("draining (shutdown timeout %.1fs)", deadline)
        self.state.draining = True
        children = asyncio.ensure_future(self.state.supervisor.shutdown(min(_CHILD_GRACE, deadline)))
        await self._close_listeners(deadline)
        with contextlib.suppress(Exception):
            await children
        self._stopped.set()

    async def kill(self) -> None:
        """Die as SIGKILL would have the process die: every HTTP connection reset unanswered, then stop at once.

        For the dev cluster's simulated hard crash; `stop` is the graceful SIGTERM (in-flight requests are
        answered).
        """
        for _, runner in self._runners:
            server = runner.server
            for handler in list(server.connections if server is not None else ()):
                if handler.transport is not None:
                    handler.transport.abort()
        await self.stop(0.0)

    async def _close_listeners(self, deadline: float) -> None:
        tasks = [runner.cleanup() for _, runner in self._runners]
        if self._grpc is not None:
            tasks.append(self._grpc.stop(deadline))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("error while closing a listener: %r", result)
        self._runners.clear()
        self._grpc = None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
