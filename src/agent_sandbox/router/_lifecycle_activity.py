"""Activity records for lifecycle-managed Sandboxes: the first of the router's two lifecycle jobs (`_lifecycle`).

What counts as use of a Sandbox with an idle timeout (docs/lifecycle.md "Idle auto-suspend"): a request, from
its start until its response head (a slow call is in use while it runs), and after the head only while its
bytes move - each relayed chunk is activity, so a long download keeps the Sandbox up and a response held open
in silence (an EventSource, a long-poll) does not. The same rule for every kind: an HTTP/1.1 exchange, each
stream of an h2c connection (in use until its response head, even with no byte moving: a slow unary call; a
gRPC call until it ends, a silent streaming one being a command still running), a WebSocket (after its `101`, in use only while data frames move; its
pings and pongs are heartbeats of an open tab, not use). The router keeps it in memory and writes the
`last-activity` annotation at most once per `--sandbox-lifecycle-activity-interval` (capped at a quarter of the
Sandbox's idle timeout) per Sandbox, in the background; when the recorded activity is older than half the idle
timeout, the write is made before the request is proxied (`ActivityRecorder.record`), so a lifecycle controller
about to suspend the Sandbox sees it first. A unit of its own: it shares only the API client and the lifecycle
state with resume on request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol

from ..api import lifecycle as lc
from ..api.constants import OperatingMode
from ..api.meta import format_rfc3339nano
from ..kube import SANDBOX, ApiClient, KubeError
from ._lifecycle_state import LifecycleState
from ._metrics import RouterMetrics

__all__ = ["ActivityRecorder", "Key", "Traffic"]

log = logging.getLogger("agent_sandbox.router.lifecycle")

_URGENT_WRITE_TIMEOUT = 2.0
_FLUSH_PERIOD = 1.0

Key = tuple[str, str]
"""A Sandbox's (namespace, name)."""


class Traffic(Protocol):
    """A relayed request or connection as activity sees it: an HTTP/1.1 exchange (`_exchange.Exchange`), an
    h2c connection (`_h2c._Session`), an upgraded connection (`_tunnel.Tunnel`)."""

    @property
    def awaiting_response(self) -> bool:
        """A request on it has no response head yet: in use, moving bytes or not (a slow call)."""
        ...

    @property
    def last_traffic(self) -> float:
        """When bytes that count as use last moved (`time.monotonic()`)."""
        ...


class ActivityRecorder:
    """Activity records of one router process: requests awaiting their response and traffic that moves,
    written as `last-activity` (`RouterLifecycle` adds resume on request)."""

    def __init__(
        self,
        api: ApiClient,
        state: LifecycleState,
        metrics: RouterMetrics,
        *,
        activity_interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.state = state
        self.metrics = metrics
        self.activity_interval = activity_interval
        self._clock = clock
        self._pending: dict[Key, float] = {}
        self._written: dict[Key, float] = {}
        self._watched: dict[Key, set[Traffic]] = {}

    def record(self, namespace: str, name: str) -> Awaitable[bool] | None:
        """Note a request to `namespace/name`; an awaitable when its activity must be written first.

        The awaitable's result is True when the write found the Sandbox Suspended although this router still
        saw it Running: the lifecycle controller suspended it just before (the race docs/lifecycle.md
        describes), so its pod is about to go and the request should wait for the resumed one.
        """
        if self.activity_interval <= 0:
            return None
        key = (namespace, name)
        view = self.state.sandboxes.get(key)
        if view is None or view.suspended or view.unclaimed_pool_member:
            return None  # an unclaimed pool member: not to be tampered with (module docstring)
        timeout = self.state.policy(namespace, view.annotations, view.template).idle_timeout
        if timeout is None:
            return None
        now = self._clock()
        age = now - max(view.last_activity or 0.0, self._written.get(key, 0.0))
        if age >= timeout / 2:
            self._pending.pop(key, None)
            self._written[key] = now
            return self._write_activity(key, now, bound=_URGENT_WRITE_TIMEOUT)
        if age >= min(self.activity_interval, timeout / 4):
            self._pending[key] = now
        return None

    def watch(self, namespace: str, name: str, traffic: Traffic) -> None:
        """A request or connection to the Sandbox (until `unwatch`): activity while it awaits a response head
        or moves bytes (module docstring).

        Not merely while it is open: a gRPC channel, an EventSource or a WebSocket left open for the night
        would keep the Sandbox from ever idling.
        """
        if self.activity_interval > 0:
            self._watched.setdefault((namespace, name), set()).add(traffic)

    def unwatch(self, namespace: str, name: str, traffic: Traffic) -> None:
        key = (namespace, name)
        watched = self._watched.get(key)
        if watched is not None:
            watched.discard(traffic)
            if not watched:
                del self._watched[key]

    def _in_use(self, since: float) -> list[Key]:
        """Sandboxes with a request awaiting its response, or traffic that moved after `since` (monotonic)."""
        return [
            key
            for key, watched in self._watched.items()
            if any(t.awaiting_response or t.last_traffic > since for t in watched)
        ]

    async def _write_activity(self, key: Key, when: float, *, bound: float | None = None) -> bool:
        """Write `last-activity`; True when the written Sandbox is Suspended."""
        stamp = format_rfc3339nano(datetime.fromtimestamp(when, UTC))
        patch = {"metadata": {"annotations": {lc.ANNOTATION_LAST_ACTIVITY: stamp}}}
        try:
            async with asyncio.timeout(bound):
                written = await self.api.patch(SANDBOX, key[1], patch, namespace=key[0])
        except (KubeError, TimeoutError, OSError) as exc:
            self.metrics.lifecycle_activity_write(key[0], False)
            log.info("activity record of %s/%s not written: %s", key[0], key[1], exc)
            return False
        self.metrics.lifecycle_activity_write(key[0], True)
        return (written.get("spec") or {}).get("operatingMode") == OperatingMode.SUSPENDED

    async def run(self) -> None:
        """Write the noted activity in the background (one patch per Sandbox per flush, at most)."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(_FLUSH_PERIOD)
            now = time.monotonic()
            for namespace, name in self._in_use(last):
                urgent = self.record(namespace, name)  # at the same bounded rate as new requests
                if urgent is not None:
                    await urgent
            last = now
            due, self._pending = self._pending, {}
            for key, when in due.items():
                self._written[key] = when
                await self._write_activity(key, when)
            self._prune()

    def _prune(self) -> None:
        """Forget our writes once the informer shows them (or the Sandbox is gone)."""
        for key, when in list(self._written.items()):
            view = self.state.sandboxes.get(key)
            if view is None or (view.last_activity or 0.0) >= when - 0.001:
                del self._written[key]
