"""Time as an injectable collaborator.

Owns: the `Clock` protocol (monotonic now, timers, sleep) and `RealClock`, a thin veneer over the running
event loop. Work queues, rate limiters, expectations and leader election take a `Clock` so unit tests
drive time with `agent_sandbox.kube.testing.FakeClock` and never sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "RealClock", "TimerHandle"]


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled (asyncio.TimerHandle satisfies it)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic time source with timers."""

    def now(self) -> float:
        """Monotonic seconds (only differences are meaningful)."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` once, `delay` seconds from now, on the event-loop thread."""
        ...

    async def sleep(self, delay: float) -> None:
        """Suspend the caller for `delay` seconds."""
        ...


class RealClock:
    """The event loop's clock; `now()` works outside a running loop too (falls back to time.monotonic)."""

    def now(self) -> float:
        # loop.time() is time.monotonic() for the default and uvloop loops; avoid the lookup cost.
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(delay, 0.0), callback)

    async def sleep(self, delay: float) -> None:
        await asyncio.sleep(max(delay, 0.0))


REAL_CLOCK = RealClock()
