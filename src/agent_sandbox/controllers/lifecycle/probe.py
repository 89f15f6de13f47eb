"""Ask a sandbox's runtime how long it has been idle (`GET /v1/activity`, docs/runtime.md).

The router sees only the traffic that goes through it; commands started through a port-forward, the pod
IP or gRPC reach the runtime directly, and a long command keeps a sandbox busy with no traffic at all. So the
lifecycle controller asks the runtime once, right before an idle suspend. A runtime that does not answer
(another image, a NetworkPolicy that admits only the router, a pod going away) counts as "unreachable": the
decision then rests on the routers' activity record alone (counted in
`agent_sandbox_lifecycle_activity_probes_total{result="unreachable"}`).
"""

from __future__ import annotations

import ipaddress
import logging

import aiohttp

from .plan import RuntimeActivity

__all__ = ["PROBE_TIMEOUT", "ActivityProbe"]

log = logging.getLogger("agent_sandbox.controllers.lifecycle")

PROBE_TIMEOUT = 2.0


class ActivityProbe:
    """One shared HTTP session for every probe (opened lazily, closed with `close`)."""

    def __init__(self, port: int, timeout: float = PROBE_TIMEOUT) -> None:
        self.port = port
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def ask(self, ip: str) -> RuntimeActivity:
        """The runtime's activity, or `reachable=False` when it cannot tell."""
        try:
            host = ipaddress.ip_address(ip)
        except ValueError:
            return RuntimeActivity(False)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        url = f"http://{f'[{host}]' if host.version == 6 else host}:{self.port}/v1/activity"
        try:
            async with self._session.get(url) as resp:
                if resp.status != 200:
                    return RuntimeActivity(False)
                body = await resp.json(content_type=None)
            return RuntimeActivity(
                True,
                idle_seconds=float(body["idleSeconds"]),
                running_commands=int(body.get("runningCommands") or 0),
                inflight_requests=int(body.get("inflightRequests") or 0),
            )
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as err:
            log.debug("activity probe of %s failed: %r", ip, err)
            return RuntimeActivity(False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
