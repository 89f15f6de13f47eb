"""Rate limiters: the token bucket shared by the API client and the work queue, and per-item backoff.

Owns: `TokenBucket` (golang.org/x/time/rate semantics: reservations may drive the bucket negative and
return the wait), and the work-queue `RateLimiter` family of client-go: `ItemExponentialFailureRateLimiter`
(per-item 2^n backoff), `BucketRateLimiter` (overall qps/burst), `MaxOfRateLimiter` and the
controller-runtime default `default_controller_rate_limiter()` = max(5 ms .. 1000 s exponential,
10 qps / 100 burst bucket) (controllers spec §0.5). Pure logic on an injectable clock; no sleeping here.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from ._clock import REAL_CLOCK, Clock

__all__ = [
    "BucketRateLimiter",
    "ItemExponentialFailureRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "TokenBucket",
    "default_controller_rate_limiter",
]


class TokenBucket:
    """Token bucket refilled at `qps` tokens/s up to `burst`; `reserve()` returns how long to wait.

    A non-positive `qps` means unlimited (client-go: negative QPS disables client-side throttling).
    """

    __slots__ = ("_clock", "_last", "_tokens", "burst", "qps")

    def __init__(self, qps: float, burst: int, *, clock: Clock = REAL_CLOCK) -> None:
        if qps > 0 and burst <= 0:
            raise ValueError("burst must be > 0 when qps > 0")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.now()

    @property
    def unlimited(self) -> bool:
        return self.qps <= 0

    def reserve(self) -> float:
        """Take one token now; return the delay (seconds) after which the caller may proceed."""
        if self.qps <= 0:
            return 0.0
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.qps


class RateLimiter(Protocol):
    """Decides how long an item waits before it is retried (client-go `workqueue.TypedRateLimiter`)."""

    def when(self, item: Hashable) -> float:
        """Record one more failure of `item`; return the delay before it may be processed again."""
        ...

    def forget(self, item: Hashable) -> None:
        """Stop tracking `item` (it succeeded or was given up)."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many failures of `item` are currently tracked."""
        ...


class ItemExponentialFailureRateLimiter:
    """Per-item backoff: base * 2^failures, capped at max_delay."""

    __slots__ = ("_failures", "base_delay", "max_delay")

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        exp = self._failures.get(item, 0)
        self._failures[item] = exp + 1
        # Cap the exponent before computing: 2**1000 would overflow a float multiplication.
        if exp > 62:
            return self.max_delay
        return min(self.base_delay * float(1 << exp), self.max_delay)

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """Overall token bucket across all items; per-item tracking is not kept."""

    __slots__ = ("_bucket",)

    def __init__(self, qps: float = 10.0, burst: int = 100, *, clock: Clock = REAL_CLOCK) -> None:
        self._bucket = TokenBucket(qps, burst, clock=clock)

    def when(self, item: Hashable) -> float:
        return self._bucket.reserve()

    def forget(self, item: Hashable) -> None:
        return None

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters; every limiter records every failure."""

    __slots__ = ("_limiters",)

    def __init__(self, *limiters: RateLimiter) -> None:
        self._limiters = limiters

    def when(self, item: Hashable) -> float:
        return max(limiter.when(item) for limiter in self._limiters)

    def forget(self, item: Hashable) -> None:
        for limiter in self._limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self._limiters)


def default_controller_rate_limiter(*, clock: Clock = REAL_CLOCK) -> RateLimiter:
    """controller-runtime's default: max(per-item 5 ms..1000 s exponential, 10 qps / 100 burst bucket)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0), BucketRateLimiter(10.0, 100, clock=clock)
    )
