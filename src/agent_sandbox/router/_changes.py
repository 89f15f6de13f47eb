"""A change signal: coroutines wait for "something changed", one notifier wakes them all.

Shared by the Pod cache and the lifecycle state: a request that waits for a pod to become Ready (or a
Sandbox to resume) sleeps on it instead of polling. Waiters bound their wait with `asyncio.timeout`.
"""

from __future__ import annotations

import asyncio

__all__ = ["Changes"]


class Changes:
    """Waiters woken together at the next `notify()`."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self) -> None:
        """Return at the next `notify()` (bound it with `asyncio.timeout`)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)
