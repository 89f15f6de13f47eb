"""Manager start/stop ordering and leader-election decisions, on in-memory fakes (no cluster)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from agent_sandbox.kube import (
    CONFIG_MAP,
    LEASE,
    Cache,
    CacheOptions,
    LeaderElectionConfig,
    LeaderElectionLost,
    LeaderElector,
    Manager,
    ManagerOptions,
    NotLeader,
    ServerError,
)
from agent_sandbox.kube.testing import FakeClient, FakeClock

pytestmark = pytest.mark.unit


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


class Recorder:
    def __init__(self, log: list[str], name: str, *, leader: bool) -> None:
        self.log, self.name, self.need_leader_election = log, name, leader

    async def start(self) -> None:
        self.log.append(f"start {self.name}")
        try:
            await asyncio.Event().wait()
        finally:
            self.log.append(f"stop {self.name}")


async def test_manager_starts_in_order_and_stops_leader_runnables_first() -> None:
    fake = FakeClient((CONFIG_MAP, {"metadata": {"name": "c", "namespace": "ns"}}))
    log: list[str] = []
    opts = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        new_cache=lambda _api, o: Cache(fake, o),
    )
    mgr = Manager(fake, opts)  # type: ignore[arg-type]
    inf = mgr.cache.informer(CONFIG_MAP)
    mgr.add(Recorder(log, "controller", leader=True))
    mgr.add(Recorder(log, "webhook", leader=False))
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(mgr.elected.wait(), 5)
    await settle()
    assert inf.has_synced
    assert log == ["start webhook", "start controller"]
    stop.set()
    await asyncio.wait_for(task, 5)
    assert log[2:] == ["stop controller", "stop webhook"]


async def test_manager_surfaces_a_failing_runnable() -> None:
    fake = FakeClient()

    class Broken:
        async def start(self) -> None:
            raise RuntimeError("boom")

    mgr = Manager(fake, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))  # type: ignore[arg-type]
    mgr.add(Broken())
    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.wait_for(mgr.start(asyncio.Event()), 5)


def test_leader_election_needs_a_namespace_outside_a_cluster() -> None:
    opts = ManagerOptions(leader_election=True, leader_election_id="x", metrics_bind_address="0")
    with pytest.raises(ValueError, match="--leader-election-namespace"):
        Manager(FakeClient(), opts)  # type: ignore[arg-type]


def _elector(fake: FakeClient, clock: FakeClock, identity: str) -> LeaderElector:
    cfg = LeaderElectionConfig(name="lease", namespace="ns", identity=identity)
    return LeaderElector(fake, cfg, clock=clock)  # type: ignore[arg-type]


async def test_lease_is_respected_until_it_expires_on_the_observers_clock() -> None:
    fake, clock = FakeClient(), FakeClock()
    a, b = _elector(fake, clock, "a"), _elector(fake, clock, "b")
    assert await a.try_acquire_or_renew()
    lease: Any = await fake.get(LEASE, "lease", namespace="ns")
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 15
    assert not await b.try_acquire_or_renew()  # first observation starts b's clock
    clock.advance(14)
    assert not await b.try_acquire_or_renew()
    assert await a.try_acquire_or_renew()  # a renews: the record changes...
    clock.advance(14)
    assert not await b.try_acquire_or_renew()  # ...and b restarts its clock when it first sees that
    clock.advance(14.9)
    assert not await b.try_acquire_or_renew()
    clock.advance(0.2)  # > 15 s since b first saw the renewed record
    assert await b.try_acquire_or_renew()
    lease = await fake.get(LEASE, "lease", namespace="ns")
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1


async def test_release_lets_a_candidate_acquire_immediately() -> None:
    fake, clock = FakeClient(), FakeClock()
    a, b = _elector(fake, clock, "a"), _elector(fake, clock, "b")
    await a.acquire()
    assert a.is_leader
    assert not await b.try_acquire_or_renew()
    assert await a.release()
    assert not a.is_leader
    assert await b.try_acquire_or_renew()
    assert not await a.release()  # not leader any more: nothing to release


async def test_renewal_failures_past_the_deadline_lose_leadership(caplog: pytest.LogCaptureFixture) -> None:
    fake, clock = FakeClient(), FakeClock()
    a = _elector(fake, clock, "a")
    await a.acquire()
    # Every Lease call fails: the optimistic PUT and the slow path's GET alike.
    fake.inject_error("*", ServerError(500, "InternalError", "etcd down"), kind=LEASE, times=1000)
    hold = asyncio.create_task(a.hold())
    for _ in range(20):
        clock.advance(1.0)
        await settle()
        if hold.done():
            break
    with pytest.raises(
        LeaderElectionLost, match=r"within the 10s renew deadline.*ServerError: 500 InternalError"
    ):
        await hold
    assert not a.is_leader
    assert "failed to renew lease ns/lease: ServerError: 500 InternalError: etcd down" in caplog.text


async def test_the_leader_renews_with_one_write_and_falls_back_to_a_read_when_it_fails() -> None:
    fake, clock = FakeClient(), FakeClock()
    a = _elector(fake, clock, "a")
    await a.acquire()
    fake.actions.clear()
    assert await a.try_acquire_or_renew()
    assert [verb for verb, *_ in fake.actions] == ["update"]  # client-go's fast path: no GET

    # Someone else wrote the Lease (our cached resourceVersion is stale): the optimistic PUT conflicts, the
    # slow path reads the current Lease and renews it.
    lease: Any = await fake.get(LEASE, "lease", namespace="ns")
    lease["metadata"]["annotations"] = {"touched": "yes"}
    await fake.update(LEASE, lease)
    fake.actions.clear()
    assert await a.try_acquire_or_renew()
    assert [verb for verb, *_ in fake.actions] == ["update", "get", "update"]
    lease = await fake.get(LEASE, "lease", namespace="ns")
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseTransitions"] == 0


async def test_a_leader_whose_own_lease_expired_does_not_renew_blindly() -> None:
    fake, clock = FakeClient(), FakeClock()
    a = _elector(fake, clock, "a")
    await a.acquire()
    clock.advance(16)  # past lease duration on our own clock: take the slow path and look first
    fake.actions.clear()
    assert await a.try_acquire_or_renew()
    assert [verb for verb, *_ in fake.actions] == ["get", "update"]


async def test_a_timed_out_renewal_says_so_in_the_log_and_the_loss(caplog: pytest.LogCaptureFixture) -> None:
    class Hanging(FakeClient):
        hang = False

        async def update(self, *args: Any, **kwargs: Any) -> Any:
            if self.hang:
                await asyncio.Event().wait()
            return await super().update(*args, **kwargs)

    fake = Hanging()
    # Real (small) timings: the per-attempt bound is an asyncio timeout on the loop's clock.
    cfg = LeaderElectionConfig(
        name="lease", namespace="ns", identity="a", lease_duration=0.6, renew_deadline=0.4, retry_period=0.05
    )
    a = LeaderElector(fake, cfg)  # type: ignore[arg-type]
    await a.acquire()
    fake.hang = True
    with pytest.raises(LeaderElectionLost, match="TimeoutError: renewal attempt timed out after"):
        await asyncio.wait_for(a.hold(), 5)
    assert "failed to renew lease ns/lease: TimeoutError: renewal attempt timed out after 0." in caplog.text


async def test_successful_renewals_keep_holding() -> None:
    fake, clock = FakeClient(), FakeClock()
    a = _elector(fake, clock, "a")
    await a.acquire()
    hold = asyncio.create_task(a.hold())
    for _ in range(30):
        clock.advance(1.0)
        await settle()
    assert not hold.done()
    hold.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await hold
    renews = [x for x in fake.actions if x[0] == "update"]
    assert len(renews) >= 10


async def test_leadership_lapses_at_the_renew_deadline_without_a_renewal() -> None:
    fake, clock = FakeClient(), FakeClock()
    a = _elector(fake, clock, "a")
    await a.acquire()
    clock.advance(9.9)
    assert a.is_leader
    clock.advance(0.2)  # 10 s since the acquiring write was sent: a successor may be 5 s from starting
    assert not a.is_leader
    assert await a.try_acquire_or_renew()  # nobody took it: a renewal proves leadership again
    assert a.is_leader


async def test_a_renewal_that_finds_another_holder_steps_down_at_once() -> None:
    fake, clock = FakeClient(), FakeClock()
    a, b = _elector(fake, clock, "a"), _elector(fake, clock, "b")
    await a.acquire()
    assert not await b.try_acquire_or_renew()  # b sees a's Lease: its clock starts
    # a is frozen past its lease (none of its code runs) and b takes over.
    clock.advance(16)
    assert await b.try_acquire_or_renew()
    hold = asyncio.create_task(a.hold())  # a runs again
    await settle()
    clock.advance(2)  # its retry period ends: its first look at the Lease shows b
    for _ in range(5):
        await settle()
    assert hold.done()  # not 10 s of retries while b already leads
    with pytest.raises(LeaderElectionLost, match="is held by b"):
        await hold
    assert not a.is_leader


async def test_the_manager_refuses_writes_once_leadership_is_not_current() -> None:
    fake = FakeClient()

    class Elector:
        config = LeaderElectionConfig(name="lease", namespace="ns")
        identity = "me"
        is_leader = False

        async def acquire(self) -> None:
            self.is_leader = True

        async def hold(self) -> None:
            await asyncio.Event().wait()

        async def release(self) -> bool:
            self.is_leader = False
            return True

        async def close(self) -> None:
            return None

    elector = Elector()
    opts = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        leader_election=True,
        leader_election_id="lease",
        leader_election_namespace="ns",
        new_elector=lambda _api, _cfg: elector,  # type: ignore[arg-type,return-value]
        new_cache=lambda _api, o: Cache(fake, o),
    )
    mgr = Manager(fake, opts)  # type: ignore[arg-type]
    cm = {"metadata": {"name": "c", "namespace": "ns"}}
    await mgr.client.create(CONFIG_MAP, cm)  # before any election: a standby's writes (webhook) pass
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(mgr.elected.wait(), 5)
    await mgr.client.patch(CONFIG_MAP, "c", {"data": {"a": "1"}}, namespace="ns")  # leading: written
    elector.is_leader = False  # the renew deadline passed, or the Lease was lost
    fake.actions.clear()
    with pytest.raises(NotLeader):
        await mgr.client.patch(CONFIG_MAP, "c", {"data": {"a": "2"}}, namespace="ns")
    with pytest.raises(NotLeader):
        await mgr.api.delete(CONFIG_MAP, "c", namespace="ns")
    assert fake.actions == []  # nothing was sent
    assert (await mgr.client.get(CONFIG_MAP, "c", namespace="ns")) is not None  # reads still work
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_cache_options_by_kind_scope_informers() -> None:
    fake = FakeClient(
        (CONFIG_MAP, {"metadata": {"name": "a", "namespace": "ns", "labels": {"t": "1"}}}),
        (CONFIG_MAP, {"metadata": {"name": "b", "namespace": "ns"}}),
    )
    from agent_sandbox.kube import KindOptions

    cache = Cache(fake, CacheOptions(by_kind={CONFIG_MAP: KindOptions(label_selector="t")}))
    task = asyncio.create_task(cache.start())
    try:
        names = [o["metadata"]["name"] for o in await asyncio.wait_for(cache.list(CONFIG_MAP), 5)]
        assert names == ["a"]
        with pytest.raises(RuntimeError):
            cache.set_kind_options(CONFIG_MAP, KindOptions())
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_a_candidate_wakes_when_the_holders_lease_expires() -> None:
    from agent_sandbox.kube._leaderelection import next_attempt_delay

    assert next_attempt_delay(2.0, None, 0.0) == 2.0
    assert next_attempt_delay(2.0, None, 0.999) == pytest.approx(2.3996)  # client-go's jitter
    assert next_attempt_delay(2.0, 0.7, 0.999) == pytest.approx(0.71)  # not 2.4 s: the Lease expires first
    assert next_attempt_delay(2.0, -3.0, 0.5) == pytest.approx(0.01)
    assert next_attempt_delay(2.0, 9.0, 0.5) == pytest.approx(2.2)


async def test_the_delay_follows_the_observed_holders_expiry() -> None:
    fake, clock = FakeClient(), FakeClock()
    a, b = _elector(fake, clock, "a"), _elector(fake, clock, "b")
    await a.acquire()
    assert not await b.try_acquire_or_renew()
    clock.advance(14.5)
    assert b._expires_in() == pytest.approx(0.5)
    clock.advance(1.0)
    assert await b.try_acquire_or_renew()
    assert b._expires_in() is None  # it holds the Lease itself now


async def test_a_cache_that_never_syncs_is_named() -> None:
    """A kind whose CRD is not installed keeps its informer failing: the start gives up naming it
    (controller-runtime names the kind; until December 6 the message named nothing)."""
    from agent_sandbox.kube import NotFound

    fake = FakeClient()
    fake.inject_error("list", NotFound("404 page not found"), kind=CONFIG_MAP, times=1000)
    opts = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        cache_sync_timeout=0.5,
        new_cache=lambda _api, o: Cache(fake, o),
    )
    mgr = Manager(fake, opts)  # type: ignore[arg-type]
    mgr.cache.informer(CONFIG_MAP)
    with pytest.raises(
        TimeoutError, match=r"caches to sync: configmaps\.core \(is its CustomResourceDefinition"
    ):
        await asyncio.wait_for(mgr.start(asyncio.Event()), 10)
