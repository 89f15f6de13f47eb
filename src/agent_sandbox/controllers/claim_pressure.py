"""Claim pressure: while SandboxClaims are arriving, writes that do not make a claim Ready wait.

On a control plane whose API server is the bottleneck (docs/performance.md: a warm claim is 3 writes on its
critical path but ~6 in total, plus the pool refill it causes), every bookkeeping write competes with the
two that make a claim Ready. This module is the one shared signal that lets the controllers put the
bookkeeping behind the claims, for a bounded time:

* the claim controller calls `note_arrival()` for every new, not yet Ready claim it observes;
* the system is **hot** until `calm_after` seconds pass without an arrival;
* while hot, a deferrable write waits, but never longer than `hold` seconds after it was first deferred
  (the caller keeps that first time, so a steady stream of claims cannot starve the write);
* when the system turns calm, `on_calm` listeners run (they re-enqueue what they deferred) and
  `wait_calm()` returns.

Deferrable (docs/design/claim-priority.md, which also says why each is safe for clients): the Sandbox
controller's Pod metadata patch and its observedGeneration-only status patch, the claim's post-Ready
first-ready stamp, Events, and warm-pool refill while the pool still has Ready headroom. Never deferred:
creates, ownership changes, takeovers, the claim's metadata that must precede its status, any status
write that changes a condition or a count (the pool's `readyReplicas`), a Sandbox's Pod creation, deletes.

With `hold <= 0` (`--sandbox-claim-priority-hold=0`) nothing is ever hot and every write is synchronous.

A graceful stop ends the hold for good (`flush()`, a `kube.HeldWrites` the manager awaits before it releases
the Lease): the held first-ready stamps are sent while this process may still write. The other held writes
need not be: any leader's next pass recomputes them (docs/design/claim-priority.md). The stamps are
detached from the claim worker whenever `--extensions` is on, so this runs with `hold <= 0` too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = [
    "CALM_AFTER",
    "DEFAULT_HOLD",
    "ClaimPressure",
    "ClaimPressureCollector",
    "FlushesHeldWrites",
    "HoldsWrites",
]

log = logging.getLogger(__name__)

DEFAULT_HOLD = 15.0
"""`--sandbox-claim-priority-hold` default, seconds: the longest a bookkeeping write waits behind claims."""

CALM_AFTER = 1.0
"""Seconds without a claim arrival after which the system counts as calm again."""


class HoldsWrites(Protocol):
    """A site that defers writes behind arriving claims (the Sandbox, warm pool and claim reconcilers)."""

    def held_writes(self) -> Mapping[str, int]:
        """Writes this site holds right now, by write kind (the `write` label of the held gauge)."""
        ...


@runtime_checkable
class FlushesHeldWrites(HoldsWrites, Protocol):
    """A site whose held writes a graceful stop must send itself: no successor would redo them (the claim
    controller's first-ready stamps: a successor finding a Ready claim without one can only write `unknown`)."""

    async def flush_held(self) -> None:
        """Return once the held writes are sent (`ClaimPressure.flush` has ended their hold)."""
        ...

    def unwritten(self) -> Mapping[str, int]:
        """Writes not sent: still held or in flight, or failed with nothing left to retry them (the
        controller stopped), by kind."""
        ...


class ClaimPressure:
    """Recent claim arrivals, and the bounded wait they impose on deferrable writes (module docstring)."""

    def __init__(
        self,
        hold: float = DEFAULT_HOLD,
        *,
        calm_after: float = CALM_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Args: hold: the longest wait per write (<= 0 disables); calm_after: quiet period; clock: monotonic."""
        self.hold = max(0.0, hold)
        self.calm_after = calm_after
        self._clock = clock
        self._last_arrival: float | None = None
        self._calm_listeners: list[Callable[[], None]] = []
        self._calm = asyncio.Event()
        self._calm.set()
        self._timer: asyncio.TimerHandle | None = None
        self.arrivals = 0
        self.episodes = 0
        self._holders: list[HoldsWrites] = []
        self._stopped = False

    @property
    def enabled(self) -> bool:
        return self.hold > 0

    @property
    def stopped(self) -> bool:
        """`stop()` was called: the process is stopping, its controllers' queues are shut down."""
        return self._stopped

    def note_arrival(self) -> None:
        """A new claim that is not Ready yet was observed (call from the event loop)."""
        if not self.enabled or self._stopped:
            return
        self.arrivals += 1
        self._last_arrival = self._clock()
        if self._calm.is_set():
            self._calm.clear()
            self.episodes += 1
        if self._timer is None:
            self._arm(self.calm_after)

    def hot(self) -> bool:
        """Whether a claim arrived within the last `calm_after` seconds."""
        if self._last_arrival is None:
            return False
        return self._clock() - self._last_arrival < self.calm_after

    def wait(self, since: float | None) -> float | None:
        """Seconds a deferrable write first deferred at `since` (monotonic) should still wait, or None: write now.

        `since=None` means the write was not deferred before: while hot, the full `hold` is returned and the
        caller records `now()` as its first-deferral time.
        """
        if not self.enabled or not self.hot():
            return None
        if since is None:
            return self.hold
        remaining = self.hold - (self._clock() - since)
        return remaining if remaining > 0 else None

    def now(self) -> float:
        """The clock `wait()` compares against (callers record first-deferral times with it)."""
        return self._clock()

    def report_held(self, holder: HoldsWrites) -> None:
        """Count what `holder` (a reconciler that defers writes) holds in `held_writes()` and the metrics."""
        self._holders.append(holder)

    def held_writes(self) -> dict[str, int]:
        """Writes held behind arriving claims right now, by write kind."""
        out: dict[str, int] = {}
        for holder in self._holders:
            for kind, count in holder.held_writes().items():
                out[kind] = out.get(kind, 0) + count
        return out

    def on_calm(self, listener: Callable[[], None]) -> None:
        """Call `listener` every time the system turns calm (re-enqueue deferred work there)."""
        self._calm_listeners.append(listener)

    async def wait_calm(self, within: float) -> None:
        """Return when the system is calm, or after `within` seconds, whichever is first."""
        if self._calm.is_set() or within <= 0:
            return
        try:
            async with asyncio.timeout(within):
                await self._calm.wait()
        except TimeoutError:
            pass

    def stop(self) -> None:
        """End claim priority for good (the process is stopping): never hot again, every wait ends now."""
        self._stopped = True
        self._last_arrival = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._calm.set()

    async def flush(self) -> None:
        """`kube.HeldWrites`: `stop()`, then wait until the `FlushesHeldWrites` sites sent what they held.

        Calm listeners are not run: they re-enqueue into controllers that have stopped.
        """
        self.stop()
        await asyncio.gather(*(h.flush_held() for h in self._holders if isinstance(h, FlushesHeldWrites)))

    def unwritten(self) -> dict[str, int]:
        """`kube.HeldWrites`: what the `FlushesHeldWrites` sites did not send, by kind."""
        out: dict[str, int] = {}
        for holder in self._holders:
            if isinstance(holder, FlushesHeldWrites):
                for kind, count in holder.unwritten().items():
                    out[kind] = out.get(kind, 0) + count
        return out

    async def hold_event(self, age: float) -> None:
        """Hold an Event `age` seconds old until calm, for what is left of the hold (`ManagerOptions.event_hold`)."""
        await self.wait_calm(self.hold - age)

    # ------------------------------------------------------------------ calm detection

    def _arm(self, delay: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.0), self._check)

    def _check(self) -> None:
        self._timer = None
        if self._last_arrival is None:
            return
        quiet_for = self._clock() - self._last_arrival
        if quiet_for < self.calm_after:
            self._arm(self.calm_after - quiet_for)
            return
        self._calm.set()
        for listener in list(self._calm_listeners):
            try:
                listener()
            except Exception:  # a listener's bug must not stop the others from re-enqueueing
                log.exception("claim pressure: calm listener failed")


class ClaimPressureCollector:
    """Prometheus view of claim priority, computed at scrape time (ours; upstream has no such metrics).

    `agent_sandbox_claim_priority_hot` (1 while claims arrive), `..._arrivals_total` (claims noted),
    `..._episodes_total` (hot periods), `..._held{write}` (writes held right now, per kind).
    """

    def __init__(self, pressure: ClaimPressure) -> None:
        self.pressure = pressure

    def collect(self) -> Iterator[Metric]:
        p = self.pressure
        hot = GaugeMetricFamily("agent_sandbox_claim_priority_hot", "1 while SandboxClaims are arriving.")
        hot.add_metric([], 1.0 if p.hot() else 0.0)
        yield hot
        yield CounterMetricFamily(
            "agent_sandbox_claim_priority_arrivals", "New, not yet Ready claims observed.", value=p.arrivals
        )
        yield CounterMetricFamily(
            "agent_sandbox_claim_priority_episodes",
            "Periods during which claims kept arriving.",
            value=p.episodes,
        )
        held = GaugeMetricFamily(
            "agent_sandbox_claim_priority_held",
            "Writes held behind arriving claims, by kind.",
            labels=["write"],
        )
        for kind, count in sorted(p.held_writes().items()):
            held.add_metric([kind], float(count))
        yield held
