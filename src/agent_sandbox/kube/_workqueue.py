"""The keyed, deduplicating, rate-limited work queue (client-go `workqueue` semantics, asyncio edition).

Owns the guarantees the controllers rely on (controllers spec §0.5):

* duplicate adds of a key that is waiting collapse into one entry;
* a key is handed to at most one worker at a time: a key added while it is being processed is parked
  ("dirty") and re-queued when the worker calls `done()`;
* `add_after()` delays an add (earliest deadline wins for the same key); `add_rate_limited()` delays by
  the rate limiter's backoff; `forget()` resets that backoff;
* `shutdown()` wakes all waiting workers (they get None) and refuses new adds; with `drain=True`
  `wait_drained()` waits until in-flight keys are done.

All bookkeeping is synchronous dict/set/deque work on the event-loop thread, so no locks are needed.
Time comes from an injectable `Clock`; delayed adds use `clock.call_later`, one timer per waiting key.
Does not own reconcile semantics (see `_controller`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from ._clock import REAL_CLOCK, Clock, TimerHandle
from ._ratelimit import RateLimiter, default_controller_rate_limiter
from .metrics import (
    WORKQUEUE_ADDS,
    WORKQUEUE_DEPTH,
    WORKQUEUE_LONGEST_RUNNING,
    WORKQUEUE_QUEUE_DURATION,
    WORKQUEUE_RETRIES,
    WORKQUEUE_UNFINISHED_WORK,
    WORKQUEUE_WORK_DURATION,
)

__all__ = ["WorkQueue"]

K = TypeVar("K", bound=Hashable)


class _Metrics:
    """Labelled metric children of one named queue (resolved once, used on every add/get/done)."""

    __slots__ = ("adds", "depth", "longest", "queue_duration", "retries", "unfinished", "work_duration")

    def __init__(self, name: str) -> None:
        labels = (name, name)
        self.depth = WORKQUEUE_DEPTH.labels(*labels)
        self.adds = WORKQUEUE_ADDS.labels(*labels)
        self.queue_duration = WORKQUEUE_QUEUE_DURATION.labels(*labels)
        self.work_duration = WORKQUEUE_WORK_DURATION.labels(*labels)
        self.retries = WORKQUEUE_RETRIES.labels(*labels)
        self.unfinished = WORKQUEUE_UNFINISHED_WORK.labels(*labels)
        self.longest = WORKQUEUE_LONGEST_RUNNING.labels(*labels)


class WorkQueue(Generic[K]):
    """Deduplicating, delaying, rate-limited FIFO of keys for N concurrent workers.

    Typical worker loop::

        while (key := await queue.get()) is not None:
            try:
                ...
            finally:
                queue.done(key)
    """

    def __init__(
        self,
        name: str = "",
        *,
        rate_limiter: RateLimiter | None = None,
        clock: Clock = REAL_CLOCK,
        metrics: bool = True,
    ) -> None:
        """Create a queue.

        Args:
            name: queue (controller) name, the `name`/`controller` label of the workqueue metrics.
            rate_limiter: backoff policy; defaults to controller-runtime's (5 ms..1000 s, 10 qps/100).
            clock: time source for delays and metrics.
            metrics: publish `workqueue_*` metrics (tests may turn it off).
        """
        self.name = name
        self._limiter = rate_limiter or default_controller_rate_limiter(clock=clock)
        self._clock = clock
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._delayed: dict[K, tuple[float, TimerHandle]] = {}
        self._added_at: dict[K, float] = {}
        self._started_at: dict[K, float] = {}
        self._shutting_down = False
        self._drained: asyncio.Event | None = None
        self._m = _Metrics(name) if metrics else None

    # ------------------------------------------------------------------ state

    def __len__(self) -> int:
        """Keys ready to be handed out (not counting delayed or in-flight keys)."""
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    @property
    def processing(self) -> frozenset[K]:
        """Keys currently held by workers."""
        return frozenset(self._processing)

    @property
    def delayed(self) -> int:
        """Number of keys waiting for a delayed add."""
        return len(self._delayed)

    # ------------------------------------------------------------------ adds

    def add(self, key: K) -> None:
        """Queue `key` now unless it is already waiting; park it if a worker holds it."""
        if self._shutting_down or key in self._dirty:
            return
        m = self._m
        if m is not None:
            m.adds.inc()
        self._dirty.add(key)
        if key in self._processing:
            return
        self._push(key)

    def _push(self, key: K) -> None:
        self._queue.append(key)
        if self._m is not None:
            self._m.depth.inc()
            self._added_at[key] = self._clock.now()
        self._wake_one()

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` after `delay` seconds; an earlier pending deadline for the same key wins."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        deadline = self._clock.now() + delay
        pending = self._delayed.get(key)
        if pending is not None:
            if pending[0] <= deadline:
                return
            pending[1].cancel()
        handle = self._clock.call_later(delay, lambda: self._fire(key))
        self._delayed[key] = (deadline, handle)

    def _fire(self, key: K) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K) -> None:
        """Queue `key` after the rate limiter's backoff (counts a retry)."""
        if self._m is not None:
            self._m.retries.inc()
        self.add_after(key, self._limiter.when(key))

    def forget(self, key: K) -> None:
        """Reset the backoff of `key` (call after success)."""
        self._limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        """Failures of `key` tracked by the rate limiter."""
        return self._limiter.num_requeues(key)

    # ------------------------------------------------------------------ consume

    async def get(self) -> K | None:
        """Wait for the next key and mark it in flight; None once the queue is shut down."""
        while not self._queue:
            if self._shutting_down:
                return None
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                # If we were woken but cancelled before running, pass the wake-up on so no key is stranded.
                if fut.done() and not fut.cancelled() and self._queue:
                    self._wake_one()
                raise
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        m = self._m
        if m is not None:
            now = self._clock.now()
            m.depth.dec()
            added = self._added_at.pop(key, None)
            if added is not None:
                m.queue_duration.observe(now - added)
            self._started_at[key] = now
        return key

    def done(self, key: K) -> None:
        """Release `key` after processing; if it was re-added meanwhile, queue it again."""
        self._processing.discard(key)
        m = self._m
        if m is not None:
            started = self._started_at.pop(key, None)
            if started is not None:
                m.work_duration.observe(self._clock.now() - started)
        if key in self._dirty and not self._shutting_down:
            self._push(key)
        if self._drained is not None and not self._processing:
            self._drained.set()

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Refuse new adds, drop waiting and delayed keys, and wake every `get()` (they return None).

        Unlike client-go, keys that are queued but not started are dropped rather than handed out:
        reconciliation is level-based, so the next start (or the next leader) lists everything anyway, and
        a bounded drain only has to wait for keys already in flight.
        """
        self._shutting_down = True
        for _, handle in self._delayed.values():
            handle.cancel()
        self._delayed.clear()
        if self._m is not None:
            self._m.depth.dec(len(self._queue))
        self._queue.clear()
        self._dirty.clear()
        self._added_at.clear()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def wait_drained(self) -> None:
        """Wait until no key is in flight (use after `shutdown()` to drain workers)."""
        if not self._processing:
            return
        if self._drained is None or self._drained.is_set():
            self._drained = asyncio.Event()
        await self._drained.wait()

    def update_unfinished_work(self) -> None:
        """Refresh the `unfinished_work`/`longest_running` gauges (called periodically, as client-go does)."""
        if self._m is None:
            return
        now = self._clock.now()
        ages = [now - t for t in self._started_at.values()]
        self._m.unfinished.set(sum(ages))
        self._m.longest.set(max(ages, default=0.0))
