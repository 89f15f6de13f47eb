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
import signal
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
_AIOHTTP_UNBOUNDED = 7 * 24 * 3600.0  # aiohttp's own drain bound, never reached: the stop's deadline is ours
# After the deadline's aborts: how long the handlers get to finish their cancellation (they kill their
# command's group and return; nothing is written any more).
_AFTER_ABORT = 1.0
_FLUSH_POLL = 0.05
# A command SIGKILLed by the stop is still answered (`exit_code: -9`): the kill comes this long before the
# listeners' deadline (half the grace when that is shorter), and a stop with less grace than this (a crash,
# grace 0) keeps its listeners open this long after the kill. Without it a grace <= 2 s killed the commands
# at the very moment the connections were reset (until December 7): their answers were lost.
_ANSWER_WINDOW = 0.5


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
            # The stop's deadline is ours (`_close_http`), one for the whole close: aiohttp's waits its timeout
            # for a handler, then cancels it and waits as long again - a client that stopped reading held the
            # stop for twice --shutdown-timeout (until December 7).
            shutdown_timeout=_AIOHTTP_UNBOUNDED,
            handler_cancellation=True,  # a client that goes away cancels its command
            # A path is in the request line, percent-encoded: a legal one (PATH_MAX 4096 bytes, non-ASCII
            # names 3 characters per byte) needs up to ~12 KiB, past aiohttp's default of 8190. Upstream's
            # runtimes take 16 KiB (uvicorn) and 1 MiB (Go) of head.
            max_line_size=MAX_HEAD_LINE,
            max_field_size=MAX_HEAD_LINE,
        )
        await runner.setup()
        self._runners.append((name, runner))
        sock = _bind(self.config.listen_host, port, name)
        site = web.SockSite(runner, sock)
        await site.start()
        self.ports[name] = sock.getsockname()[1]

    async def _start_grpc(self) -> None:
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        add_process_service(server, self.state)
        # v1 and v1alpha, as grpc-go's reflection.Register in sandboxd (v1-only clients exist).
        enable_reflection(server, (processv1.SERVICE,))
        self._grpc = server
        host, wanted = self.config.listen_host, self.config.grpc_port
        if wanted:
            # grpcio says only "Failed to bind to address" (a RuntimeError, after a log line of its own on
            # stderr): a socket bound here first gives the reason (Address already in use) as an OSError.
            _bind(host, wanted, "gRPC", listen=False).close()
        try:
            port = server.add_insecure_port(_host_port(host, wanted))
        except RuntimeError as err:  # grpcio >= 1.5x raises; older ones returned 0
            raise OSError(f"cannot bind gRPC to {_host_port(host, wanted)}: {err}") from None
        if port == 0:
            raise OSError(f"cannot bind gRPC to {_host_port(host, wanted)}")
        await server.start()
        self.ports["grpc"] = port

    @property
    def draining(self) -> bool:
        return self.state.draining

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health 503, children SIGTERM then SIGKILL after 2 s, HTTP drains, gRPC stops.

        One deadline, `grace` (default `--shutdown-timeout`) from now, bounds it all: in-flight requests are
        answered and answers already written are flushed while the clients read them; what is still going
        at the deadline is cut off (HTTP connections reset, gRPC calls cancelled). With a short grace the
        children are SIGKILLed 0.5 s (at most half the grace) before the deadline, so their commands are
        still answered; a grace under 1 s (0: a crash) keeps the listeners open 0.5 s after that kill.
        """
        if self._stopped.is_set():
            return
        deadline = self.config.shutdown_timeout if grace is None else grace
        log.info("draining (shutdown timeout %.1fs)", deadline)
        self.state.draining = True
        loop = asyncio.get_running_loop()
        # SIGKILL at 2 s, or _ANSWER_WINDOW (at most half the grace) before the deadline; the listeners close
        # by the deadline, or _ANSWER_WINDOW after the kill when the grace is shorter than that. So the stop
        # never outlasts a grace >= 2 x _ANSWER_WINDOW, and a grace-0 crash takes at most _ANSWER_WINDOW.
        kill_at = max(0.0, min(_CHILD_GRACE, deadline - min(_ANSWER_WINDOW, deadline / 2)))
        window = max(deadline, kill_at + _ANSWER_WINDOW)
        end = loop.time() + window
        children = asyncio.ensure_future(self.state.supervisor.shutdown(kill_at))
        # A stop with no grace (a simulated crash, a pod deleted with grace 0) asked for the resets: not worth
        # a warning in the pod's log.
        await self._close_listeners(window, logging.WARNING if deadline > 0 else logging.DEBUG)
        # The children were SIGKILLed at their grace; one that does not die of it (stuck in the kernel)
        # does not hold the stop past its deadline either.
        await asyncio.wait({children}, timeout=max(0.0, end - loop.time()))
        if not children.done():
            self.kill_children()
            children.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await children
        self._stopped.set()

    def kill_children(self) -> None:
        """SIGKILL every process group this server started, now (the process is about to exit unclean)."""
        self.state.supervisor.signal_all(signal.SIGKILL)

    async def kill(self) -> None:
        """Die as SIGKILL would have the process die: every HTTP connection reset unanswered, then stop at once.

        For the dev cluster's simulated hard crash; `stop` is the graceful SIGTERM (in-flight requests are
        answered).
        """
        for _, runner in self._runners:
            _abort_connections(runner)
        await self.stop(0.0)

    async def _close_listeners(self, deadline: float, level: int = logging.DEBUG) -> None:
        end = asyncio.get_running_loop().time() + deadline
        tasks = [self._close_http(name, runner, end, level) for name, runner in self._runners]
        if self._grpc is not None:
            tasks.append(self._grpc.stop(deadline))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("error while closing a listener: %r", result)
        self._runners.clear()
        self._grpc = None

    async def _close_http(self, name: str, runner: web.AppRunner, end: float, level: int) -> None:
        """Close one HTTP listener by `end` (loop time): drain, flush, then reset what is left."""
        loop = asyncio.get_running_loop()
        server = runner.server
        # Snapshot now: aiohttp forgets a connection once its handler is done, while its answer may still
        # be queued in the transport for a client that reads slowly.
        transports = [h.transport for h in (server.connections if server is not None else ()) if h.transport]
        cleanup = asyncio.ensure_future(runner.cleanup())
        try:
            await asyncio.wait({cleanup}, timeout=max(0.0, end - loop.time()))
            if not cleanup.done():
                if count := _abort_connections(runner):
                    log.log(
                        level,
                        "%s: %d request(s) still in progress at the shutdown deadline: reset",
                        name,
                        count,
                    )
                await asyncio.wait({cleanup}, timeout=_AFTER_ABORT)
                if not cleanup.done():
                    log.warning(
                        "%s: request handlers did not finish after their connections were reset", name
                    )
                    cleanup.cancel()
            # Answers written but not yet sent: flushed while the deadline lasts (closed transports close
            # their sockets once their buffers are empty), then dropped. Polled: asyncio tells no one when a
            # closing transport's buffer empties.
            while (pending := [t for t in transports if t.get_write_buffer_size()]) and loop.time() < end:  # noqa: ASYNC110
                await asyncio.sleep(min(_FLUSH_POLL, end - loop.time()))
            if pending:
                log.log(
                    level, "%s: %d answer(s) not sent by the shutdown deadline: reset", name, len(pending)
                )
                for transport in pending:
                    transport.abort()
        finally:
            if not cleanup.done():  # stop() itself was cancelled
                cleanup.cancel()
        if not cleanup.cancelled():
            await cleanup  # its error, if any, is logged by the caller

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def _abort_connections(runner: web.AppRunner) -> int:
    """Reset every connection of `runner` (their handlers are cancelled); how many were still open."""
    server = runner.server
    count = 0
    for handler in list(server.connections if server is not None else ()):
        if (transport := handler.transport) is not None:
            count += not transport.is_closing()
            transport.abort()  # a closing one too: it may still hold an answer nobody reads
    return count


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int, name: str, *, listen: bool = True) -> socket.socket:
    """A non-blocking socket bound to host:port (listening unless `listen` is false).

    OSError names the listener and the address (`[Errno 98] cannot bind legacy to 127.0.0.1:8888: Address
    already in use`), keeping the errno: the console script prints it as its one-line error.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            reason = err.strerror or str(err)
            raise OSError(err.errno, f"cannot bind {name} to {_host_port(host, port)}: {reason}") from None
        if listen:
            sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
