"""When a runtime was last used: the activity a lifecycle controller asks for before suspending a sandbox.

Counted as activity: every HTTP request on the legacy and sandboxd REST listeners except the probes
(`GET /`, `/v1/health`, `/v1/metadata`, `/v1/activity`), and every command start and exit (gRPC included:
its commands go through the same supervisor). A sandbox is busy, whatever the clock says, while a command
runs or a request is in flight (a long download, a streamed command). Served as `GET /v1/activity` on the
REST listener (docs/runtime.md, docs/lifecycle.md); idle time is measured on the runtime's monotonic clock,
so the caller's and the pod's clocks need not agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ._http import Handler

__all__ = ["PROBE_PATHS", "Activity"]

PROBE_PATHS = frozenset({"/", "/v1/health", "/v1/metadata", "/v1/activity"})
"""Requests that read the runtime's state without using the sandbox: not activity."""


class Activity:
    """Last-use time and in-flight requests of one runtime server."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self.inflight = 0

    def touch(self) -> None:
        """Something used the sandbox now."""
        self._last = self._clock()

    def idle_seconds(self, running_commands: int) -> float:
        """Seconds since the last use; 0 while a command runs or a request is in flight."""
        if running_commands or self.inflight:
            return 0.0
        return max(0.0, self._clock() - self._last)

    def report(self, running_commands: int) -> dict[str, float | int]:
        """The `GET /v1/activity` body."""
        return {
            "idleSeconds": round(self.idle_seconds(running_commands), 3),
            "runningCommands": running_commands,
            "inflightRequests": self.inflight,
        }

    def middleware(self) -> Middleware:
        """aiohttp middleware counting every non-probe request, from its start to its end."""

        @web.middleware
        async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path in PROBE_PATHS and request.method in ("GET", "HEAD"):
                return await handler(request)
            self.inflight += 1
            self.touch()
            try:
                return await handler(request)
            finally:
                self.inflight -= 1
                self.touch()

        return count
