"""Replenish hold, refill bucket, progress tracker (controllers spec §3.7, §3.10)."""

from __future__ import annotations

import pytest

from agent_sandbox.controllers.claim_pressure import ClaimPressure
from agent_sandbox.controllers.warmpool.shaping import (
    ClaimYield,
    MissingTemplates,
    ProgressTracker,
    RefillBuckets,
    ReplenishHold,
)
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit

K = "ns/pool"


def test_zero_delay_never_holds() -> None:
    hold = ReplenishHold(0)
    assert hold.observe(K, 5, 10, 0.0) == 0
    assert hold.observe(K, 1, 10, 1.0) == 0


def test_hold_state_machine() -> None:
    hold = ReplenishHold(10.0)
    assert hold.observe(K, 0, 5, 0.0) == 0  # first observation: initial fill never held
    assert hold.observe(K, 5, 5, 1.0) == 0  # full
    assert hold.observe(K, 4, 5, 2.0) == pytest.approx(10.0)  # a drop arms the hold
    assert hold.observe(K, 4, 5, 5.0) == pytest.approx(7.0)  # no drop: the hold runs down
    assert hold.observe(K, 3, 5, 6.0) == pytest.approx(10.0)  # another drop re-arms it
    assert hold.observe(K, 3, 5, 16.5) == 0  # expired
    assert hold.observe(K, 2, 1, 17.0) == 0  # at/above desired: cleared


def test_hold_baseline_bumped_by_creates() -> None:
    hold = ReplenishHold(10.0)
    hold.observe(K, 2, 5, 0.0)
    hold.note_creates(K, 3)  # the cache will show 5 later
    # A stale pass still showing 2 members now reads as a drop (brief hold) rather than masking one.
    assert hold.observe(K, 2, 5, 1.0) == pytest.approx(10.0)
    hold.forget(K)
    assert hold.observe(K, 2, 5, 2.0) == 0  # forgotten: like a restart


def test_bucket_starts_full_accrues_and_caps_at_one_second() -> None:
    b = RefillBuckets(5.0)
    assert b.take(K, 3, 0.0) == (3, 0.0)
    granted, wait = b.take(K, 5, 0.0)  # 2 left
    assert granted == 2
    assert wait == pytest.approx(0.2)  # until the next whole token
    assert b.take(K, 10, 0.4) == (2, pytest.approx(0.2))  # 0.4 s accrued two tokens
    assert b.take(K, 10, 100.0)[0] == 5  # capped at capacity = rate


def test_bucket_fractional_rate_and_unpaced() -> None:
    b = RefillBuckets(0.5)
    assert b.take(K, 2, 0.0) == (1, pytest.approx(2.0))  # capacity max(1, rate) = 1
    assert b.take(K, 1, 1.0) == (0, pytest.approx(1.0))
    assert b.take(K, 1, 2.0) == (1, 0.0)
    assert RefillBuckets(0).take(K, 300, 0.0) == (300, 0.0)
    assert RefillBuckets(5).take(K, 0, 0.0) == (0, 0.0)


def test_bucket_huge_rate_does_not_overflow() -> None:
    b = RefillBuckets(1e300)
    assert b.take(K, 300, 0.0) == (300, 0.0)
    assert b.take(K, 2**31, 1.0) == (2**31, 0.0)


def test_refund_is_capped_at_capacity() -> None:
    b = RefillBuckets(2.0)
    assert b.take(K, 2, 0.0) == (2, 0.0)
    b.refund(K, 5)
    assert b.take(K, 5, 0.0)[0] == 2
    b.refund("unknown", 3)  # no bucket: nothing to refund
    assert b.take("unknown", 5, 0.0)[0] == 2


def test_progress_tracker_reports_transitions_only() -> None:
    t = ProgressTracker()
    assert not t.set(K, False)
    assert t.set(K, True)
    assert not t.set(K, True)
    assert t.set(K, False)
    t.set(K, True)
    t.forget(K)
    assert not t.set(K, False)


# --------------------------------------------------------------------------- ClaimYield (claim pressure)


def _yield(hold: float = 15.0) -> tuple[ClaimYield, ClaimPressure, FakeClock]:
    clock = FakeClock()
    pressure = ClaimPressure(hold, clock=clock.now)
    return ClaimYield(pressure), pressure, clock


def _simulate(
    y: ClaimYield, pressure: ClaimPressure, clock: FakeClock, *, desired: int, rate: float, seconds: float
) -> list[tuple[float, int, int]]:
    """Claims take `rate` members/s; the pool passes every 0.5 s and creates what it may (instantly Ready)."""
    current, taken_f, creates = desired, 0.0, []
    t0 = clock.now()
    while clock.now() - t0 < seconds:
        clock.advance(0.5)
        pressure.note_arrival()
        taken_f += rate * 0.5
        take = int(taken_f)
        taken_f -= take
        current -= take
        _, cap = y.observe(K, current=current, ready=current, desired=desired)
        allowed = (desired - current) if cap is None else cap
        allowed = max(0, min(allowed, desired - current))
        y.note_created(K, allowed)
        current += allowed
        creates.append((clock.now() - t0, allowed, current))
    return creates


async def test_claim_yield_refills_a_burst_after_it_when_the_pool_covers_it() -> None:
    y, pressure, clock = _yield(hold=15.0)
    # The gate: 1050 members, 75 taken/s for 10 s - the pool would reach its 25% floor at ~10.5 s.
    creates = _simulate(y, pressure, clock, desired=1050, rate=75, seconds=10)
    assert sum(n for _, n, _ in creates) == 0  # nothing competes with the burst
    assert y.held() == [K]
    assert 0 < y.next_due(K) <= 1.0  # the first replacements come due right after it


async def test_claim_yield_refills_a_stream_at_its_pace_then_winds_the_lag_down() -> None:
    y, pressure, clock = _yield(hold=15.0)
    # A small pool under a steady stream: 100 members, 10 taken/s - 7.5 s to the floor, less than the hold.
    creates = _simulate(y, pressure, clock, desired=100, rate=10, seconds=60)
    first = next(t for t, n, _ in creates if n)
    assert 7.0 <= first <= 8.5  # replacing starts before the pool runs down to its floor
    assert max(n for _, n, _ in creates) <= 10  # never one delayed batch (5 per 0.5 s pass is the pace)
    assert min(cur for _, _, cur in creates) >= 25  # never under the floor
    held = [n for t, n, _ in creates if first <= t <= 15]  # within the hold: refill = consumption
    assert sum(held) / (len(held) * 0.5) == pytest.approx(10, rel=0.1)
    # The stream outlasts the hold: the lag winds down over one more hold, the pool climbs back to full and
    # from then on each member is replaced as it leaves (a lag only moved writes; it removed none).
    assert all(cur == 100 for t, _, cur in creates if t >= 2 * 15 + 1)
    assert y.next_due(K) == 0


async def test_claim_yield_refills_freely_when_running_dry_or_calm() -> None:
    y, pressure, clock = _yield()
    pressure.note_arrival()
    assert y.observe(K, current=700, ready=700, desired=1000)[1] == 0
    assert y.observe(K, current=240, ready=240, desired=1000) == (0.0, 10)  # back up to the 25% floor
    clock.advance(pressure.calm_after)
    assert y.observe(K, current=240, ready=240, desired=1000) == (0.0, None)  # claims stopped
    assert y.held() == []
    off = ClaimYield(ClaimPressure(0.0))
    off.pressure.note_arrival()
    assert off.observe(K, current=1, ready=1, desired=2) == (0.0, None)


async def test_pool_passes_are_coalesced_only_while_claims_arrive() -> None:
    y, pressure, clock = _yield()
    y.passed(K)
    assert y.pass_wait(K) == 0  # calm: nothing recorded
    pressure.note_arrival()
    y.passed(K)
    clock.advance(0.2)
    assert y.pass_wait(K) == pytest.approx(0.3)
    clock.advance(0.3)
    assert y.pass_wait(K) == 0


def test_missing_templates_are_one_episode_per_template_name() -> None:
    m = MissingTemplates()
    assert m.found("ns/p") is None  # never waited: nothing to say
    assert m.missing("ns/p", "t")
    assert not m.missing("ns/p", "t")  # repeated passes: nothing new
    assert m.missing("ns/p", "u")  # re-pointed to another missing template: say so again
    assert m.missing("ns/q", "t")  # per pool
    assert m.found("ns/p") == "u"
    assert m.found("ns/p") is None
    assert m.missing("ns/p", "u")  # a new episode after it was found
    m.forget("ns/p")
    assert m.found("ns/p") is None


def test_missing_templates_belong_to_the_pool_object() -> None:
    m = MissingTemplates()
    assert m.missing("ns/p", "t", uid="a")
    assert not m.missing("ns/p", "t", uid="a")
    assert m.missing("ns/p", "t", uid="b")  # same name, recreated: another pool, another episode
    assert m.found("ns/p", uid="c") is None  # a recreated pool never waited: no Normal for it
    assert m.missing("ns/p", "t", uid="c")
    assert m.found("ns/p", uid="c") == "t"
