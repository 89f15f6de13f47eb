"""Test doubles for code built on `agent_sandbox.kube`: a fake clock and an in-memory client.

* `FakeClock` implements `Clock`; time moves only when a test calls `advance()`, so queue backoffs,
  expectations TTLs and lease timings are tested without sleeping.
* `FakeClient` implements `Reader`, `IndexedReader`, `Writer` and `StatusWriter` (and the list/watch
  source used by informers) in memory, like controller-runtime's `pkg/client/fake`. Use it for
  controller `execute()` tests and informer logic; never in integration tests.

See `_fakeclient.py` for FakeClient's exact semantics.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from ._fakeclient import FakeClient, WatchControl

__all__ = ["FakeClient", "FakeClock", "WatchControl"]


class _FakeTimer:
    __slots__ = ("callback", "cancelled", "deadline")

    def __init__(self, deadline: float, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A manually advanced monotonic clock with timers (implements `Clock`)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _FakeTimer:
        timer = _FakeTimer(self._now + max(delay, 0.0), callback)
        heapq.heappush(self._timers, (timer.deadline, next(self._seq), timer))
        return timer

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.call_later(delay, wake)
        try:
            await fut
        finally:
            timer.cancel()

    @property
    def pending(self) -> int:
        """Number of timers not yet fired or cancelled."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def next_deadline(self) -> float | None:
        """Deadline of the earliest live timer, or None."""
        for deadline, _, timer in sorted(self._timers):
            if not timer.cancelled:
                return deadline
        return None

    def advance(self, seconds: float) -> None:
        """Move time forward, firing due timers in deadline order (each sees `now()` = its deadline)."""
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            deadline, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, deadline)
            timer.callback()
        self._now = target
