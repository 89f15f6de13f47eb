"""Pure arrival schedules of the load generator: seeded Poisson (open loop) and uniform pacing.

Every schedule is a sorted list of offsets in seconds from the start of a phase; the driver sleeps until
each offset and fires the request without waiting for earlier ones (open loop, like the upstream stress
harness's `claims-warm-sustained` phase). Poisson schedules come from `random.Random(seed)`, so a run is
reproducible: the same seed, rate and duration give the same arrivals on every machine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

__all__ = ["poisson_arrivals", "pool_replicas", "round_robin", "uniform_arrivals"]


def uniform_arrivals(rate: float, duration: float) -> list[float]:
    """`rate` arrivals per second for `duration` seconds, evenly spaced (CL2's QPS pacing).

    rate x duration arrivals in total (rounded), the first at 0.
    """
    if rate <= 0 or duration <= 0:
        return []
    count = round(rate * duration)
    return [i / rate for i in range(count)]


def poisson_arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """A Poisson process of intensity `rate` over [0, duration): exponential gaps from `Random(seed)`."""
    if rate <= 0 or duration <= 0:
        return []
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def round_robin(count: int, targets: Sequence[str]) -> list[str]:
    """Target of each of `count` arrivals, cycling through `targets` (upstream's namespace sharding)."""
    if not targets:
        raise ValueError("round_robin needs at least one target")
    return [targets[i % len(targets)] for i in range(count)]


def pool_replicas(rate: float, pools: int, headroom_s: float, *, minimum: int = 1) -> int:
    """Replicas per pool for arrival `rate` split over `pools`: ceil(rate / pools x headroom) (§9.1)."""
    if pools <= 0:
        raise ValueError("pools must be > 0")
    return max(minimum, math.ceil(rate / pools * headroom_s))
