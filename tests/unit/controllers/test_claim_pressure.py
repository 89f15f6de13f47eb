"""`ClaimPressure`: hot while claims arrive, a bounded wait per deferred write, calm listeners."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox.controllers.claim_pressure import ClaimPressure, ClaimPressureCollector
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit


async def test_disabled_is_never_hot_and_never_defers() -> None:
    p = ClaimPressure(0.0)
    p.note_arrival()
    assert not p.enabled
    assert not p.hot()
    assert p.wait(None) is None
    assert p.arrivals == 0


async def test_hot_until_quiet_for_calm_after() -> None:
    clock = FakeClock()
    p = ClaimPressure(10.0, calm_after=1.0, clock=clock.now)
    assert not p.hot()
    p.note_arrival()
    assert p.hot()
    clock.advance(0.9)
    assert p.hot()
    clock.advance(0.2)
    assert not p.hot()


async def test_wait_is_the_hold_then_what_is_left_of_it_and_never_rearms() -> None:
    clock = FakeClock()
    p = ClaimPressure(10.0, clock=clock.now)
    p.note_arrival()
    assert p.wait(None) == 10.0
    since = p.now()
    clock.advance(4.0)
    p.note_arrival()  # claims keep coming: the first deferral time still counts
    assert p.wait(since) == pytest.approx(6.0)
    clock.advance(0.5)
    p.note_arrival()
    clock.advance(5.6)
    p.note_arrival()
    assert p.wait(since) is None  # 10.1 s after the first deferral: write now even though still hot


async def test_calm_runs_listeners_once_per_episode_and_releases_waiters() -> None:
    p = ClaimPressure(30.0, calm_after=0.05)
    calls: list[int] = []
    p.on_calm(lambda: calls.append(1))
    p.note_arrival()
    waiter = asyncio.create_task(p.wait_calm(30.0))
    await asyncio.sleep(0.02)
    p.note_arrival()  # extends the episode
    await asyncio.sleep(0.02)
    assert not waiter.done()
    await asyncio.wait_for(waiter, 1.0)
    assert calls == [1]
    assert not p.hot()
    assert p.episodes == 1
    p.note_arrival()
    await asyncio.sleep(0.1)
    assert calls == [1, 1]
    assert p.episodes == 2


async def test_wait_calm_returns_at_its_bound_while_still_hot() -> None:
    p = ClaimPressure(30.0, calm_after=10.0)
    p.note_arrival()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await p.wait_calm(0.05)
    assert p.hot()
    assert loop.time() - t0 >= 0.04
    await p.wait_calm(0)  # a spent bound does not wait at all


async def test_a_failing_listener_does_not_stop_the_others() -> None:
    p = ClaimPressure(30.0, calm_after=0.01)
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("bug")

    p.on_calm(broken)
    p.on_calm(lambda: calls.append("ok"))
    p.note_arrival()
    await p.wait_calm(1.0)
    await asyncio.sleep(0)
    assert calls == ["ok"]


async def test_collector_exports_hot_counters_and_held_writes() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    class Site:
        def __init__(self, held: dict[str, int]) -> None:
            self.held = held

        def held_writes(self) -> dict[str, int]:
            return self.held

    p = ClaimPressure(10.0, calm_after=5.0)
    p.report_held(Site({"sandbox": 3}))
    p.report_held(Site({"pool_refill": 1, "sandbox": 0}))
    assert p.held_writes() == {"sandbox": 3, "pool_refill": 1}
    registry = CollectorRegistry()
    registry.register(ClaimPressureCollector(p))
    text = generate_latest(registry).decode()
    assert "agent_sandbox_claim_priority_hot 0.0" in text
    p.note_arrival()
    p.note_arrival()
    text = generate_latest(registry).decode()
    assert "agent_sandbox_claim_priority_hot 1.0" in text
    assert "agent_sandbox_claim_priority_arrivals_total 2.0" in text
    assert "agent_sandbox_claim_priority_episodes_total 1.0" in text
    assert 'agent_sandbox_claim_priority_held{write="sandbox"} 3.0' in text
    assert 'agent_sandbox_claim_priority_held{write="pool_refill"} 1.0' in text


async def test_stop_ends_every_wait_for_good_and_flush_counts_only_what_a_stop_must_send() -> None:
    p = ClaimPressure(30.0, calm_after=30.0)

    class Recomputed:  # the Sandbox controller's held writes: any leader's next pass redoes them
        def held_writes(self) -> dict[str, int]:
            return {"sandbox": 4}

    class Stamps:
        def __init__(self) -> None:
            self.held = 2

        def held_writes(self) -> dict[str, int]:
            return {"claim_stamp": self.held}

        def unwritten(self) -> dict[str, int]:
            return {"claim_stamp": self.held}

        async def flush_held(self) -> None:
            await p.wait_calm(30.0)
            self.held = 0

    stamps = Stamps()
    p.report_held(Recomputed())
    p.report_held(stamps)
    p.note_arrival()
    waiter = asyncio.create_task(p.wait_calm(30.0))
    assert p.unwritten() == {"claim_stamp": 2}
    await asyncio.wait_for(p.flush(), 1.0)
    await asyncio.wait_for(waiter, 1.0)
    assert p.unwritten() == {"claim_stamp": 0}
    assert p.held_writes() == {"sandbox": 4, "claim_stamp": 0}
    p.note_arrival()
    assert not p.hot()
    await asyncio.wait_for(p.hold_event(0.0), 1.0)
