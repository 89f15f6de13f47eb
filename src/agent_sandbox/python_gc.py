"""Full collections of CPython's cyclic garbage collector on a timer, for long-running processes (the controller).

Why: a full (generation 2) collection scans every tracked object, and CPython starts one whenever the objects
promoted since the last one reach a quarter of the long-lived ones. The controller's caches are long-lived
objects that are replaced, not mutated: every watch event decodes a new object tree (tens of dicts and lists)
that outlives the young generations. So under a steady claim stream with thousands of Sandboxes and Pods
cached, full collections come due every ~20 s, and each holds the event loop - and every claim in
flight - for as long as it scans the whole cache (docs/design/python-gc.md has the measurements). They find
almost nothing: decoded JSON has no reference cycles, and the cycles the process does make (an asyncio task,
its exception and traceback) are short-lived and collected by the young generations.

What: `tune()` keeps the young generations' thresholds and puts the automatic full collection out of reach;
`FullCollections` (a manager runnable) runs one every `interval` seconds, after the claims arriving at that
moment have stopped or one more interval has passed, so garbage in cycles that reached the old generation is
still reclaimed. `AGENT_SANDBOX_GC_TUNING=off` keeps CPython's defaults.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping

__all__ = ["FULL_COLLECTION_INTERVAL", "OPT_OUT", "FullCollections", "tune", "tuned"]

log = logging.getLogger(__name__)

OPT_OUT = "AGENT_SANDBOX_GC_TUNING"
FULL_COLLECTION_INTERVAL = 300.0
"""Seconds between full collections; cyclic garbage in the old generation lives at most about twice this."""
_UNREACHABLE = 2**31 - 1
"""Young-generation collections before an automatic full one: never, in practice."""


def tune(environ: Mapping[str, str] | None = None) -> bool:
    """Leave full collections to `FullCollections`; False (nothing changed) when opted out."""
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT, "").lower() == "off":
        return False
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _UNREACHABLE)
    return True


def tuned() -> bool:
    """Whether `tune()` took automatic full collections away (so a `FullCollections` must run)."""
    return gc.get_threshold()[2] == _UNREACHABLE


class FullCollections:
    """Runs `gc.collect()` every `interval` s, after `wait_calm(within)` returns (claims stopped, or `within` s).

    Runs on every replica (a follower's caches are as large as the leader's).
    """

    need_leader_election = False

    def __init__(
        self,
        interval: float = FULL_COLLECTION_INTERVAL,
        *,
        wait_calm: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.interval = interval
        self.wait_calm = wait_calm
        self.collections = 0

    async def start(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self.wait_calm is not None:
                await self.wait_calm(self.interval)
            self.collect()

    def collect(self) -> int:
        """One full collection now; returns the number of unreachable objects found."""
        started = time.perf_counter()
        found = gc.collect()
        self.collections += 1
        elapsed_ms = (time.perf_counter() - started) * 1e3
        log.debug("full garbage collection: %d unreachable objects, %.1f ms", found, elapsed_ms)
        return found
