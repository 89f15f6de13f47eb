"""The conversion webhook's HTTPS listener on its own thread and event loop (docs/design/webhook-thread.md).

While v1alpha1 is served the API server's watch cache sends every change of a Sandbox or claim through the
webhook, one at a time per resource, so each answer's latency bounds how fast *every* watcher (our own
informers included) sees changes. On the controllers' loop that latency included the loop's backlog under
load; on a thread of its own it does not. The thread also runs the pair's :class:`CertWatcher` checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

from aiohttp import web

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.controllers.webhook.app import build_app
from agent_sandbox.controllers.webhook.certwatch import CertWatcher
from agent_sandbox.controllers.webhook.errors import WebhookError

__all__ = ["SERVER_OPTIONS", "SHUTDOWN_GRACE", "ServingThread"]

# One logger name for every webhook module: operators filter on the field, and it predates the split.
log = logging.getLogger("agent_sandbox.controllers.webhook.server")

#: Options of the listener's request handler. No automatic decompression: a review is never compressed
#: (:func:`_read_body` refuses a compressed body with 415), and what aiohttp still drains of a refused body
#: after answering (its lingering close, at most 10 s) is then discarded as it comes, never inflated.
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}
#: Seconds a stopping listener waits for the reviews in flight (a review takes milliseconds; the API server
#: retries one that fails). aiohttp's default, 60 s, let a review whose body was still arriving at a SIGTERM
#: hold the controller's stop past the kubelet's 30 s grace (CI, December 7), Lease release included.
SHUTDOWN_GRACE = 3.0


class ServingThread:
    """The aiohttp listener on a dedicated thread with its own event loop (and the pair's watcher)."""

    def __init__(self, host: str | None, port: int, certs: CertWatcher, poll_interval: float) -> None:
        self._host, self._port, self._certs, self._poll = host, port, certs, poll_interval
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = port
        self._thread = threading.Thread(target=self._main, name="conversion-webhook", daemon=True)

    def start(self) -> int:
        """Start listening; returns the bound port. Blocks until the listener is up or failed."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self.port

    def stop(self) -> None:
        """Close the listener and end the thread (blocks until it has, at most a few seconds)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop.set)
        # aiohttp waits up to the grace for a review's handler, then cancels it and waits up to the grace again
        # (a conversion in a worker thread does not end on cancellation).
        bound = 2 * SHUTDOWN_GRACE + 1.0
        self._thread.join(bound)
        if self._thread.is_alive():  # a daemon thread: it does not keep the process alive
            log.warning("conversion webhook listener did not stop within %.0fs", bound)

    def _main(self) -> None:
        try:  # the loop the controller process runs on (`controllers.main`), when installed
            import uvloop  # type: ignore[import-not-found,unused-ignore]

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(
            build_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_GRACE,
            **SERVER_OPTIONS,
        )
        try:
            await runner.setup()
            site = web.TCPSite(
                runner, self._host, self._port, ssl_context=self._certs.context, reuse_address=True
            )
            await site.start()
        except OSError as exc:
            self._error = WebhookError(f"cannot listen on {self._host or '*'}:{self._port}: {exc}")
        except BaseException as exc:
            self._error = exc
        if self._error is not None:
            await runner.cleanup()
            self._ready.set()
            return
        self.port = _bound_port(runner, self._port)
        self._ready.set()
        watcher = asyncio.create_task(self._watch_certs()) if self._poll > 0 else None
        try:
            await self._stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            await runner.cleanup()

    async def _watch_certs(self) -> None:
        # On this thread's loop: reading two small files (and loading them when they changed) takes well
        # under a millisecond, and the SNI callback that reads the result runs here too.
        while True:
            await asyncio.sleep(self._poll)
            try:
                self._certs.check()
            except Exception as exc:  # never let the watcher end: the listener keeps the pair it has
                log.error("checking the webhook certificate failed: %s", describe_error(exc), exc_info=exc)


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for server in runner.addresses:
        if isinstance(server, tuple) and len(server) >= 2:
            return int(server[1])
    return requested
