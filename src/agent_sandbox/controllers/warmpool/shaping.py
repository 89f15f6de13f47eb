"""Per-pool in-memory state between passes (controllers spec §3.7, §3.10).

Owns the three small state machines the reconciler consults at execution time, each keyed by the pool
("namespace/name") and dropped with the pool (`forget`):

* `ReplenishHold` (`--sandbox-warm-pool-replenish-delay`): after members drop out of the pool (claims),
  hold refill for `delay`, re-armed on every further drop; initial fill and scale-ups are never held.
* `RefillBuckets` (`--sandbox-warm-pool-max-refill-rate`): a token bucket of capacity `max(1, rate)`
  per pool pacing creates; tokens of creates the expectations gate refused are refunded.
* `ProgressTracker`: whether the pool is in the not-progressing state, so the Warning/Normal events of
  §3.10 are emitted on transitions only.
* `MissingTemplates` (ours): which template a pool is waiting for, so its `SandboxTemplateNotFound` /
  `SandboxTemplateFound` events are emitted on transitions only (docs/design/warmpool-quirks.md).
* `ClaimYield` (ours, `--sandbox-claim-priority-hold`): while claims are arriving and the pool still has
  Ready headroom, refill waits behind them, bounded by the hold (docs/design/claim-priority.md).

All methods are synchronous (atomic on the event loop) and take `now` (monotonic seconds) explicitly,
so unit tests drive time by hand. The state is lost on restart by design: the first observation after a
restart never holds, and the bucket starts full.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ..claim_pressure import ClaimPressure

__all__ = [
    "HEADROOM",
    "PASS_INTERVAL_WHILE_HOT",
    "ClaimYield",
    "MissingTemplates",
    "ProgressTracker",
    "RefillBuckets",
    "ReplenishHold",
]

HEADROOM = 0.25
"""Under claim pressure a pool still keeps at least this fraction of its desired members (the floor)."""

RATE_WINDOW = 1.0
"""Seconds of an episode after which its consumption rate is estimated (and the lag fixed)."""

PASS_INTERVAL_WHILE_HOT = 0.5
"""While claims arrive, at most one full pass per pool per this many seconds (each pass is O(members), and
every adoption re-enqueues the pool)."""


@dataclass(slots=True)
class _HoldState:
    last_members: int
    defer_until: float = 0.0


class ReplenishHold:
    """`observeMembers` of §3.7: how long refill must wait after a drop."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._state: dict[str, _HoldState] = {}

    def observe(self, key: str, current: int, desired: int, now: float) -> float:
        """Record the active member count; return the remaining hold in seconds (0 = create now)."""
        if self.delay <= 0:
            return 0.0
        st = self._state.get(key)
        if st is None:
            self._state[key] = _HoldState(current)  # no baseline: never hold the first fill
            return 0.0
        dropped = current < st.last_members
        st.last_members = current
        if current >= desired:
            st.defer_until = 0.0
            return 0.0
        if dropped:
            st.defer_until = now + self.delay  # re-armed on every drop
        return max(0.0, st.defer_until - now)

    def note_creates(self, key: str, created: int) -> None:
        """Raise the baseline by creates the cache may not show yet (a stale low count then reads as a drop)."""
        st = self._state.get(key)
        if st is not None and created > 0:
            st.last_members += created

    def forget(self, key: str) -> None:
        self._state.pop(key, None)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    last: float


class RefillBuckets:
    """`takeRefillTokens` of §3.7: a per-pool token bucket of `rate` creates/s, capacity `max(1, rate)`."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._capacity = max(1.0, rate)
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str, want: int, now: float) -> tuple[int, float]:
        """Grant up to `want` creates; returns (granted, seconds until the next whole token if short)."""
        if self.rate <= 0 or want <= 0:
            return want, 0.0
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(self._capacity, now)  # a new bucket starts full
        elif now > b.last:
            b.tokens = min(self._capacity, b.tokens + self.rate * (now - b.last))
            b.last = now
        # Compare as floats first: a huge rate must not turn into a bogus integer grant.
        granted = want if b.tokens >= want else int(b.tokens)
        b.tokens -= granted
        if granted >= want:
            return granted, 0.0
        wait_ns = math.ceil((1.0 - b.tokens) / self.rate * 1e9)
        return granted, wait_ns / 1e9

    def refund(self, key: str, n: int) -> None:
        """Return tokens of creates that were never issued (capped at capacity)."""
        if self.rate <= 0 or n <= 0:
            return
        b = self._buckets.get(key)
        if b is not None:
            b.tokens = min(self._capacity, b.tokens + n)

    def forget(self, key: str) -> None:
        self._buckets.pop(key, None)


class ProgressTracker:
    """Pools currently "not progressing" (holding unschedulable members past the grace period)."""

    def __init__(self) -> None:
        self._not_progressing: set[str] = set()

    def set(self, key: str, not_progressing: bool) -> bool:
        """Record the state; True when it changed (an event is due)."""
        was = key in self._not_progressing
        if was == not_progressing:
            return False
        if not_progressing:
            self._not_progressing.add(key)
        else:
            self._not_progressing.discard(key)
        return True

    def forget(self, key: str) -> None:
        self._not_progressing.discard(key)


class MissingTemplates:
    """Pools whose template does not exist, with the name each one waits for.

    Keyed by the name too, so a pool re-pointed from one missing template to another missing one says so
    again; and by the pool's UID, so a pool deleted and recreated under the same name before a pass saw it
    gone (the work queue coalesces the two) is a new episode. A pass that could not tell (a template read
    failing otherwise) changes nothing.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[str, str]] = {}

    def missing(self, key: str, template: str, *, uid: str = "") -> bool:
        """Record that `key` (pool object `uid`) waits for `template`; True when that is new (a Warning is
        due)."""
        if self._waiting.get(key) == (uid, template):
            return False
        self._waiting[key] = (uid, template)
        return True

    def found(self, key: str, *, uid: str = "") -> str | None:
        """Record that `key`'s template exists; the name it waited for when that ended a wait of this same
        pool object, else None."""
        waited = self._waiting.pop(key, None)
        return waited[1] if waited is not None and waited[0] == uid else None

    def forget(self, key: str) -> None:
        self._waiting.pop(key, None)


@dataclass(slots=True)
class _Episode:
    started: float
    baseline: int
    """Members the pool had after its previous pass (plus what that pass created)."""
    consumed: deque[float] = field(default_factory=deque)
    """When each not-yet-replaced member was seen leaving (monotonic), oldest first."""
    taken: int = 0
    """Members seen leaving after the episode's first pass (those seen by it left at an unknown time)."""
    lag: float | None = None
    """How long each replacement waits, fixed once the episode's consumption rate is known."""


class ClaimYield:
    """Refill yields to arriving claims: each member a claim takes is replaced one lag later.

    While claims arrive, a pool counts the members that leave it and replaces each one `lag` seconds after
    it left, so replacements come due at the pace members were taken: a burst is refilled after it, a steady
    stream steadily, never in one delayed batch. The lag is the hold, shortened - once the first
    `RATE_WINDOW` of the episode shows the consumption rate - to the time at which that rate would bring the
    pool down to `HEADROOM` of its desired members, so a small pool starts replacing before it runs dry.
    Whatever the lag, creates keep at least `HEADROOM` of the members in place, and everything due is
    released when the claims stop.

    A lag moves writes in time, it does not remove any: under a stream that outlasts the hold it would only
    keep the pool at its floor for as long as the claims keep coming, and a refill that slows down (a busy
    cluster) then lets the pool run dry and claims go cold. So the hold bounds the episode, not each member
    (the never-re-arm rule of the other held writes): once the episode is one hold old the lag winds down to
    zero over one more hold - the pool climbs back to full at about 1.5x the consumption rate rather than in
    one batch - and from then on members are replaced as they leave, as upstream's pool does.
    """

    def __init__(self, pressure: ClaimPressure) -> None:
        self.pressure = pressure
        self._episodes: dict[str, _Episode] = {}
        self._last_pass: dict[str, float] = {}

    def pass_wait(self, key: str) -> float:
        """Seconds until pool `key` may run its next full pass (0 = now; only ever > 0 while claims arrive)."""
        if not self.pressure.hot():
            self._last_pass.pop(key, None)
            return 0.0
        last = self._last_pass.get(key)
        if last is None:
            return 0.0
        return max(0.0, PASS_INTERVAL_WHILE_HOT - (self.pressure.now() - last))

    def passed(self, key: str) -> None:
        """A full pass of pool `key` ran (recorded only while claims arrive)."""
        if self.pressure.hot():
            self._last_pass[key] = self.pressure.now()

    def _lag(self, ep: _Episode, now: float) -> float:
        """The episode's lag at `now`: fixed for its first hold, then winding down to 0 over one more."""
        hold = self.pressure.hold
        lag = hold if ep.lag is None else ep.lag
        over = now - ep.started - hold
        if over <= 0:
            return lag
        return lag * max(0.0, 1.0 - over / hold) if hold > 0 else 0.0

    def observe(self, key: str, *, current: int, ready: int, desired: int) -> tuple[float, int | None]:
        """Refill of pool `key` now: (seconds to wait, cap on creates); `(0, None)` = refill freely."""
        if not self.pressure.hot():
            self._episodes.pop(key, None)
            return 0.0, None
        now = self.pressure.now()
        ep = self._episodes.get(key)
        if current >= desired:
            # Whole again while claims still arrive: the episode (and its age) goes on.
            if ep is not None:
                ep.baseline, ep.consumed = current, deque()
            return 0.0, None
        if ep is None:  # the pool was whole before the claims came (else no episode would be needed)
            ep = self._episodes[key] = _Episode(started=now, baseline=desired)
        left = max(0, ep.baseline - current)
        ep.consumed.extend([now] * left)
        if now > ep.started:
            ep.taken += left
        ep.baseline = current
        floor = math.ceil(desired * HEADROOM)
        age = now - ep.started
        if ep.lag is None and age >= RATE_WINDOW and ep.taken:
            rate = ep.taken / age
            ep.lag = min(self.pressure.hold, age + max(0, ready - floor) / rate)
        if not ep.consumed:
            return 0.0, None
        lag = self._lag(ep, now)
        due = sum(1 for t in ep.consumed if now - t >= lag)
        allowed = max(due, floor - current)
        if allowed > 0:
            return 0.0, allowed
        return ep.consumed[0] + lag - now, 0

    def note_created(self, key: str, created: int) -> None:
        """`created` replacements went out: they settle the oldest consumed members."""
        ep = self._episodes.get(key)
        if ep is None or created <= 0:
            return
        for _ in range(min(created, len(ep.consumed))):
            ep.consumed.popleft()
        ep.baseline += created

    def next_due(self, key: str) -> float:
        """Seconds until the next held replacement of pool `key` comes due (0: none held)."""
        ep = self._episodes.get(key)
        if ep is None or not ep.consumed:
            return 0.0
        now = self.pressure.now()
        return max(0.0, ep.consumed[0] + self._lag(ep, now) - now)

    def held(self) -> list[str]:
        """Pools with replacements held back (re-enqueued when the claims stop)."""
        return [key for key, ep in self._episodes.items() if ep.consumed]

    def forget(self, key: str) -> None:
        self._episodes.pop(key, None)
        self._last_pass.pop(key, None)
