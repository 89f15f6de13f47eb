"""How the h2c pass-through reaches its sandbox (`dial_sandbox`): resolve and dial, with retries and resume holds.

The h2c twin of `Proxy._forward`'s dial phase: the same retries, backoff, descriptor check and lifecycle holds,
for a connection whose first bytes the sandbox sends (SETTINGS).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ._fdlimit import EXHAUSTED_DETAIL
from ._lifecycle import MAX_HOLDS
from ._resolve import Target
from ._routing import Route, RouteError
from ._upstream import UpstreamConnection

if TYPE_CHECKING:
    from ._proxy import Proxy

__all__ = ["_OutOfDescriptors", "dial_sandbox"]

log = logging.getLogger("agent_sandbox.router.h2c")


class _OutOfDescriptors(RouteError):
    """The dial failed for want of descriptors (503 with `Retry-After`, as the HTTP/1.1 path answers)."""


async def dial_sandbox(proxy: Proxy, route: Route, suspending: bool = False) -> UpstreamConnection:
    """Resolve and dial the sandbox, retrying dial-phase failures as the HTTP/1.1 path does.

    A refused connection, a sandbox the cache has no Ready pod for yet, or a connection the sandbox
    closed before the router relayed a byte (a runtime shutting down) is retried with
    re-resolution and backoff (`--upstream-max-retries`, `--upstream-retry-*-delay`): nothing has
    reached the sandbox, so a just-Ready or just-resumed sandbox is reached instead of failing. With
    `--sandbox-lifecycle`, such a failure (or `suspending`: the activity write found the Sandbox just
    suspended) first holds the connection while a Sandbox that resumes on request resumes.

    Raises:
        RouteError: 403 from the resolver, 503 when the Sandbox cannot be resumed, or 502 once the
            retries are spent or a dial timed out.
    """
    settings = proxy.settings
    lifecycle = proxy.lifecycle
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.proxy_timeout
    delay = settings.retry_initial
    retries = holds = 0
    resumed = False  # as `Proxy._forward`: once held, a Pod IP the route carries predates the resume
    if lifecycle is not None and (suspending or lifecycle.seen_suspended(route)):
        proxy.resolver.refuse_named_elsewhere(route)  # as `Proxy._forward`: 403 first, resuming nothing
        holds += 1  # as `Proxy._forward`: not to the pod a suspend is taking away
        resumed = await lifecycle.hold(route, deadline, lifecycle.current_pod(route), leaving=True)
    while True:
        retryable = True
        target: Target | None = None
        try:
            target = proxy.resolver.resolve_fast(route, resumed=resumed)
            if target is None:
                async with asyncio.timeout_at(deadline):
                    target = await proxy.resolver.resolve(route, resumed=resumed)
            proxy.metrics.admit_namespace(route.namespace)  # resolved: a sandbox of that namespace
            upstream = await proxy.pool.dial(
                target.host,
                target.port,
                deadline=min(deadline, loop.time() + settings.response_header_timeout),
                server_speaks_first=True,
            )
            if not upstream.closed:
                return upstream
            error = f"{target.host}:{target.port} closed the connection before any byte was relayed"
        except TimeoutError:
            retryable, error = False, "timed out"
        except OSError as exc:
            if proxy.out_of_descriptors(route.namespace, exc):
                # As HTTP/1.1: at once, no retries.
                raise _OutOfDescriptors(503, EXHAUSTED_DETAIL) from exc
            error = str(exc)
        if lifecycle is not None and holds < MAX_HOLDS and loop.time() < deadline:
            holds += 1
            if await lifecycle.hold(route, deadline, target.entry if target is not None else None):
                retries, delay, resumed = 0, settings.retry_initial, True
                continue
        if not retryable or retries >= settings.max_retries or loop.time() + delay >= deadline:
            log.info(
                "upstream dial failed",
                extra={
                    "sandbox_id": route.sandbox_id,
                    "sandbox_namespace": route.namespace,
                    "error": error,
                },
            )
            proxy.metrics.upstream_error(route.namespace, "dial")
            raise RouteError(502, f"Could not connect to the backend sandbox: {route.sandbox_id}")
        retries += 1
        proxy.metrics.upstream_retry(route.namespace)
        await asyncio.sleep(delay)
        delay = min(delay * 2, settings.retry_max)
