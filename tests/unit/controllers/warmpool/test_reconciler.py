"""The warm pool reconciler over real informers and the in-memory API (controllers spec §3.2-§3.7, §6.3)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.controllers.blueprint import blueprint_hash
from agent_sandbox.controllers.claim_pressure import ClaimPressure
from agent_sandbox.controllers.indexes import INDEX_POOL_TEMPLATE_REF
from agent_sandbox.controllers.warmpool import (
    ExpectationsObserver,
    WarmPoolConfig,
    WarmPoolReconciler,
    pools_for_template,
)
from agent_sandbox.controllers.warmpool import execute as pool_execute
from agent_sandbox.controllers.warmpool.config import (
    DEFAULT_READINESS_GRACE_PERIOD,
    DEFAULT_UNSCHEDULABLE_RECHECK_INTERVAL,
)
from agent_sandbox.controllers.warmpool.shaping import ClaimYield
from agent_sandbox.kube import (
    POD,
    SANDBOX,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    Conflict,
    Expectations,
    Forbidden,
    NotFound,
    Request,
    Result,
    ServerError,
    Timeout,
    TransportError,
)
from agent_sandbox.kube.testing import FakeClient, FakeClock

from .fixtures import NOW, NS, fake_cluster, member, pool, standard, template, ts, unschedulable_pod
from .harness import running

pytestmark = pytest.mark.unit

READY = {
    "type": "Ready",
    "status": "True",
    "reason": "DependenciesReady",
    "message": "",
    "lastTransitionTime": ts(NOW),
}


async def make_ready(fake: FakeClient, name: str) -> None:
    await fake.patch_status(SANDBOX, name, {"status": {"conditions": [READY]}}, namespace=NS)


async def test_fill_observe_ready_and_steady_state() -> None:
    async with running(standard(3)) as h:
        assert await h.reconcile() == Result()
        assert h.creates() == 3
        await h.settle()
        assert h.expectations.satisfied("ns/pool")
        await h.reconcile()
        assert h.creates() == 3
        assert h.pool_status() == {
            "replicas": 3,
            "readyReplicas": 0,
            "selector": f"agents.x-k8s.io/warm-pool-sandbox={naming.name_hash('pool')}",
            "observedGeneration": 1,
        }
        for sb in h.sandboxes():
            await make_ready(h.fake, sb["metadata"]["name"])
        await h.settle()
        await h.reconcile()
        assert h.pool_status()["readyReplicas"] == 3
        writes = len(h.fake.actions)
        await h.settle()
        await h.reconcile()  # converged: a pass writes nothing
        assert [a for a in h.fake.actions[writes:] if a[0] != "get" and a[0] != "list"] == []


class StaleReader:
    """Serves a frozen member list (a cache that never catches up); everything else is live."""

    def __init__(self, fake: FakeClient, frozen: list[dict[str, Any]]) -> None:
        self._fake = fake
        self._frozen = frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fake, name)

    async def list_by_index(
        self, kind: Any, index: str, value: str, *, namespace: str | None = None
    ) -> list[Any]:
        return [dict(o) for o in self._frozen]


async def test_no_over_creation_with_a_stale_cache_sequential_and_parallel() -> None:
    fake = standard(5)
    rec = WarmPoolReconciler(StaleReader(fake, []), config=WarmPoolConfig(grace_jitter=0))  # type: ignore[arg-type]
    first = await rec.reconcile(Request(NS, "pool"))
    assert first == Result()
    results = [await rec.reconcile(Request(NS, "pool")) for _ in range(5)]
    results += await asyncio.gather(*(rec.reconcile(Request(NS, "pool")) for _ in range(10)))
    assert len(fake.objects(SANDBOX)) == 5
    assert all(r.requeue_after == 30.0 for r in results)  # fallback while the creates are unobserved


async def test_parallel_first_passes_create_exactly_replicas() -> None:
    fake = standard(7)
    rec = WarmPoolReconciler(StaleReader(fake, []), config=WarmPoolConfig(grace_jitter=0))  # type: ignore[arg-type]
    await asyncio.gather(*(rec.reconcile(Request(NS, "pool")) for _ in range(10)))
    assert len(fake.objects(SANDBOX)) == 7


async def test_repeated_passes_with_live_informers_create_exactly_replicas() -> None:
    async with running(standard(40)) as h:
        # Passes race the informer: some see a partial cache, the gate keeps creates exact.
        for _ in range(6):
            await asyncio.gather(*(h.reconcile() for _ in range(4)))
            await asyncio.sleep(0)
        await h.settle()
        await h.reconcile()
        assert h.creates() == 40
        assert len(h.sandboxes()) == 40


async def test_batch_size_caps_one_pass_and_the_pool_fills_over_observed_rounds() -> None:
    async with running(standard(10), WarmPoolConfig(max_batch_size=4, grace_jitter=0)) as h:
        await h.reconcile()
        assert h.creates() == 4
        await h.settle()
        await h.reconcile()
        assert h.creates() == 8
        await h.settle()
        await h.reconcile()
        assert h.creates() == 10


async def test_terminating_members_block_replacements_until_gone() -> None:
    tmpl = template()
    doomed = member("doomed", tmpl=tmpl)
    doomed["metadata"]["finalizers"] = ["test/hold"]
    fake = fake_cluster(
        (SANDBOX_TEMPLATE, tmpl), (SANDBOX_WARM_POOL, pool(2)), (SANDBOX, member("a")), (SANDBOX, doomed)
    )
    async with running(fake) as h:
        pool_uid = h.fake.objects(SANDBOX_WARM_POOL)[0]["metadata"]["uid"]
        for sb in h.sandboxes():
            refs = sb["metadata"]["ownerReferences"]
            refs[0]["uid"] = pool_uid
            await h.fake.patch(
                SANDBOX, sb["metadata"]["name"], {"metadata": {"ownerReferences": refs}}, namespace=NS
            )
        await h.fake.delete(SANDBOX, "doomed", namespace=NS)  # finalizer keeps it terminating
        await h.settle()
        await h.reconcile()
        assert h.creates() == 0
        await h.fake.patch(SANDBOX, "doomed", {"metadata": {"finalizers": None}}, namespace=NS)
        await h.settle()
        await h.reconcile()
        assert h.creates() == 1


async def test_scale_down_deletes_excess_and_zero_is_written() -> None:
    async with running(standard(3)) as h:
        await h.reconcile()
        await h.settle()
        await h.fake.patch(SANDBOX_WARM_POOL, "pool", {"spec": {"replicas": 0}}, namespace=NS)
        await h.settle()
        await h.reconcile()
        assert h.sandboxes() == []
        await h.settle()
        await h.reconcile()
        assert h.pool_status()["replicas"] == 0
        assert h.pool_status()["readyReplicas"] == 0
        assert h.pool_status()["observedGeneration"] == 2


async def test_excess_delete_not_found_lowers_the_expectation_at_once() -> None:
    fake = standard(1)
    ghosts = [member("ghost-a", age=10), member("ghost-b", age=20)]
    for g in ghosts:
        g["metadata"]["ownerReferences"][0]["uid"] = fake.objects(SANDBOX_WARM_POOL)[0]["metadata"]["uid"]
    rec = WarmPoolReconciler(StaleReader(fake, ghosts), config=WarmPoolConfig(grace_jitter=0))  # type: ignore[arg-type]
    await rec.reconcile(Request(NS, "pool"))  # one excess delete: NotFound (already gone)
    assert rec.expectations.satisfied("ns/pool")
    assert not rec.expectations.is_pending_deletion("ns/pool", "ghost-a-uid")


async def test_errors_skip_the_status_write_and_are_raised() -> None:
    fake = standard(2)
    fake.inject_error("create", Forbidden(403, "Forbidden", "quota"), kind=SANDBOX)
    rec = WarmPoolReconciler(fake, config=WarmPoolConfig(grace_jitter=0))
    with pytest.raises(Forbidden):
        await rec.reconcile(Request(NS, "pool"))
    assert "status" not in fake.objects(SANDBOX_WARM_POOL)[0]
    assert fake.objects(SANDBOX) == []  # slow start: the first batch of one failed, nothing more tried
    assert rec.expectations.satisfied("ns/pool")  # refused creates were lowered at once


@pytest.mark.parametrize(
    "lost",
    [
        ServerError(500, "InternalError", "etcd timeout"),
        TransportError("POST: connection reset"),
        Timeout("t"),
    ],
)
async def test_a_create_whose_answer_was_lost_keeps_its_expectation_for_the_hold(
    lost: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may have applied (generateName: no name to look up): no replacement until the hold has passed."""
    monkeypatch.setattr(pool_execute, "AMBIGUOUS_CREATE_HOLD", 0.05)
    fake = standard(2)
    fake.inject_error("create", lost, kind=SANDBOX)
    rec = WarmPoolReconciler(fake, config=WarmPoolConfig(grace_jitter=0))
    with pytest.raises(type(lost)):
        await rec.reconcile(Request(NS, "pool"))
    assert not rec.expectations.satisfied("ns/pool")
    result = await rec.reconcile(Request(NS, "pool"))
    assert fake.objects(SANDBOX) == []  # still waiting for the member the lost create may have made
    assert result.requeue_after
    await asyncio.sleep(0.1)
    assert rec.expectations.satisfied("ns/pool")
    await rec.reconcile(Request(NS, "pool"))
    assert len(fake.objects(SANDBOX)) == 2


def test_a_deferred_lowering_never_touches_a_later_batch() -> None:
    exp = Expectations()
    assert exp.try_expect_creations("k", 1)
    token = exp.current_record("k")
    exp.creation_observed("k")  # the lost create had applied
    assert exp.try_expect_creations("k", 3)  # the next batch
    exp.lower_creations("k", 1, raised=token)  # the first batch's deferred lowering fires late
    assert exp.pending("k") == (3, frozenset())


async def test_quiet_cluster_grace_requeue_then_hold_with_one_event() -> None:
    cfg = WarmPoolConfig(readiness_grace_period=60, unschedulable_recheck_interval=45, grace_jitter=0)
    async with running(standard(1), cfg) as h:
        await h.reconcile()
        await h.settle()
        (sb,) = h.sandboxes()
        name = sb["metadata"]["name"]
        await h.fake.create(POD, unschedulable_pod(name), namespace=NS)
        await h.settle()
        result = await h.reconcile()
        assert result.requeue_after is not None
        # Earliest grace deadline + 2 s slack (creationTimestamp has whole-second resolution).
        assert 60 < result.requeue_after < 63.5
        h.now += 120  # the self-scheduled pass after the deadline
        assert (await h.reconcile()).requeue_after == 45
        assert await h.reconcile() == Result(requeue_after=45)
        assert h.sandboxes()[0]["metadata"]["name"] == name  # held, not replaced
        assert h.events.events == [
            (
                "Warning",
                "WarmPoolNotProgressing",
                "Reconciling",
                "1/1 sandboxes are unschedulable past the 1m0s readiness grace period; holding them "
                "instead of replacing (replacements would be equally unschedulable)",
            )
        ]
        await make_ready(h.fake, name)
        await h.settle()
        await h.reconcile()
        assert h.events.events[-1] == (
            "Normal",
            "WarmPoolProgressing",
            "Reconciling",
            "Warm pool is progressing again",
        )


async def test_stuck_member_is_replaced_after_the_grace_period() -> None:
    async with running(standard(1), WarmPoolConfig(readiness_grace_period=30, grace_jitter=0)) as h:
        await h.reconcile()
        await h.settle()
        (old,) = h.sandboxes()
        h.now += 60
        await h.reconcile()
        assert h.sandboxes() == []
        await h.settle()
        await h.reconcile()
        (new,) = h.sandboxes()
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        assert h.creates() == 2


def test_defaults_and_configured_grace() -> None:
    assert DEFAULT_READINESS_GRACE_PERIOD == 300.0
    assert DEFAULT_UNSCHEDULABLE_RECHECK_INTERVAL == 60.0
    cfg = WarmPoolConfig()
    assert (cfg.readiness_grace_period, cfg.unschedulable_recheck_interval, cfg.max_batch_size) == (
        300.0,
        60.0,
        300,
    )
    custom = WarmPoolConfig(readiness_grace_period=5, unschedulable_recheck_interval=7, max_batch_size=0)
    assert (custom.readiness_grace_period, custom.unschedulable_recheck_interval, custom.max_batch_size) == (
        5,
        7,
        300,
    )


def test_expectations_observer_counts_only_pool_owned_events() -> None:
    exp = Expectations(clock=FakeClock())
    obs = ExpectationsObserver(exp)
    assert exp.try_expect_creations("ns/pool", 1)
    exp.expect_deletion("ns/pool", "u1")
    claimed = member("x", owner_uid="claim-uid")
    orphan = member("y", owner_uid=None)
    for obj in (claimed, orphan):
        obs.on_add(obj)
        obs.on_delete(obj)
    obs.on_update(member("z"), member("z"))
    assert exp.pending("ns/pool") == (1, frozenset({"u1"}))
    owned = member("m", uid="u1")
    obs.on_add(owned)
    obs.on_delete(owned)
    assert exp.satisfied("ns/pool")


async def take_member(h: Any, name: str) -> None:
    """A claim takes member `name`: it leaves the pool (owner and pool label replaced)."""
    await h.fake.patch(
        SANDBOX,
        name,
        {"metadata": {"ownerReferences": [], "labels": {c.LABEL_WARM_POOL_SANDBOX: None}}},
        namespace=NS,
    )
    await h.settle()


async def test_replenish_delay_holds_refill_after_a_drop_while_gc_continues() -> None:
    cfg = WarmPoolConfig(replenish_delay=10, readiness_grace_period=30, grace_jitter=0)
    async with running(standard(3), cfg) as h:
        await h.reconcile()
        await h.settle()
        for sb in h.sandboxes()[:2]:
            await make_ready(h.fake, sb["metadata"]["name"])
        await h.settle()
        await h.reconcile()
        ready = [s for s in h.sandboxes() if s.get("status")]
        # A claim takes one member: it leaves the pool (owner and pool label replaced).
        claimed = ready[0]["metadata"]["name"]
        await take_member(h, claimed)
        h.now += 40  # the never-Ready member is now stuck
        result = await h.reconcile()
        assert result.requeue_after == pytest.approx(10)
        assert h.creates() == 3  # no refill during the hold ...
        assert len(h.sandboxes()) == 2  # ... but the stuck member was deleted anyway
        h.clock.advance(11)
        await h.settle()
        await h.reconcile()
        assert h.creates() == 5


async def test_refill_rate_paces_creates_with_token_timed_requeues() -> None:
    async with running(standard(5), WarmPoolConfig(max_refill_rate=2, grace_jitter=0)) as h:
        await h.reconcile()
        assert h.creates() == 2  # the bucket starts full: capacity = rate
        await h.settle()
        result = await h.reconcile()
        assert h.creates() == 2
        assert result.requeue_after == pytest.approx(0.5)
        h.clock.advance(1.0)
        await h.reconcile()
        assert h.creates() == 4
        await h.settle()
        h.clock.advance(0.5)
        await h.reconcile()
        assert h.creates() == 5


async def test_tokens_refused_by_the_expectations_gate_are_refunded() -> None:
    fake = standard(4)
    clock = FakeClock()
    rec = WarmPoolReconciler(
        StaleReader(fake, []),  # type: ignore[arg-type]
        config=WarmPoolConfig(max_refill_rate=2, grace_jitter=0),
        clock=clock,
    )
    await rec.reconcile(Request(NS, "pool"))
    assert len(fake.objects(SANDBOX)) == 2
    # Refill 2 more tokens; the gate refuses (creates unobserved) and refunds them.
    clock.advance(1.0)
    assert (await rec.reconcile(Request(NS, "pool"))).requeue_after == 30.0
    rec.expectations.forget("ns/pool")
    await rec.reconcile(Request(NS, "pool"))
    assert len(fake.objects(SANDBOX)) == 4


async def test_recreate_replaces_stale_members_with_the_new_template() -> None:
    async with running(standard(2, strategy="Recreate")) as h:
        await h.reconcile()
        await h.settle()
        await h.reconcile()
        new_spec = template(image="img:2")["spec"]
        await h.fake.patch(SANDBOX_TEMPLATE, "tmpl", {"spec": new_spec}, namespace=NS)
        await h.settle()
        await h.reconcile()
        assert h.sandboxes() == []
        await h.settle()
        await h.reconcile()
        hashes = {s["metadata"]["labels"][c.LABEL_SANDBOX_TEMPLATE_HASH] for s in h.sandboxes()}
        assert hashes == {blueprint_hash(new_spec)}
        assert len(h.sandboxes()) == 2


async def test_orphans_are_adopted() -> None:
    fake = fake_cluster(
        (SANDBOX_TEMPLATE, template()), (SANDBOX_WARM_POOL, pool(1)), (SANDBOX, member("o", owner_uid=None))
    )
    async with running(fake) as h:
        await h.reconcile()
        (sb,) = h.sandboxes()
        assert (
            sb["metadata"]["ownerReferences"][0]["uid"]
            == h.fake.objects(SANDBOX_WARM_POOL)[0]["metadata"]["uid"]
        )
        assert h.creates() == 0


async def test_missing_template_maintains_status_without_error() -> None:
    fake = fake_cluster((SANDBOX_WARM_POOL, pool(2)))
    rec = WarmPoolReconciler(fake, config=WarmPoolConfig(grace_jitter=0))
    assert await rec.reconcile(Request(NS, "pool")) == Result()
    assert fake.objects(SANDBOX) == []
    assert fake.objects(SANDBOX_WARM_POOL)[0]["status"]["replicas"] == 0


async def test_a_missing_template_is_one_warning_event_and_its_arrival_one_normal_event() -> None:
    """Ours (warmpool-quirks.md): the pool's schema has no conditions, so an Event is all that says why it
    stays empty; once per episode, not per pass."""
    async with running(fake_cluster((SANDBOX_WARM_POOL, pool(1))), WarmPoolConfig(grace_jitter=0)) as h:
        for _ in range(3):
            assert await h.reconcile() == Result()
            await h.settle()
        assert h.events.events == [
            (
                "Warning",
                c.EVENT_SANDBOX_TEMPLATE_NOT_FOUND,
                "Reconciling",
                f'SandboxTemplate "tmpl" not found in namespace "{NS}"; no sandboxes are created until it exists',
            )
        ]
        await h.fake.create(SANDBOX_TEMPLATE, template(), namespace=NS)
        await h.settle()
        await h.reconcile()
        await h.settle()
        await h.reconcile()
        assert len(h.sandboxes()) == 1
        assert h.events.events[1:] == [
            (
                "Normal",
                c.EVENT_SANDBOX_TEMPLATE_FOUND,
                "Reconciling",
                f'SandboxTemplate "tmpl" found in namespace "{NS}"',
            )
        ]


async def test_a_pool_deleted_and_recreated_between_passes_is_a_new_episode() -> None:
    """The episode belongs to the pool object (its UID), not its name: a pool deleted and recreated under
    the same name before a pass saw it gone is another pool, and its missing template is said again."""
    async with running(fake_cluster((SANDBOX_WARM_POOL, pool(1))), WarmPoolConfig(grace_jitter=0)) as h:
        await h.reconcile()
        await h.settle()
        old_uid = h.fake.objects(SANDBOX_WARM_POOL)[0]["metadata"]["uid"]
        await h.fake.delete(SANDBOX_WARM_POOL, "pool", namespace=NS)
        again = pool(1)
        again["metadata"]["uid"] = "pool-uid-2"
        await h.fake.create(SANDBOX_WARM_POOL, again, namespace=NS)
        assert h.fake.objects(SANDBOX_WARM_POOL)[0]["metadata"]["uid"] != old_uid
        await h.settle()
        await h.reconcile()
        await h.reconcile()
        assert [e[1] for e in h.events.events] == [c.EVENT_SANDBOX_TEMPLATE_NOT_FOUND] * 2


async def test_a_template_that_exists_from_the_start_is_no_event() -> None:
    async with running(standard(1), WarmPoolConfig(grace_jitter=0)) as h:
        await h.reconcile()
        await h.settle()
        await h.reconcile()
        assert h.events.events == []


async def test_pool_gone_or_deleting_forgets_its_records() -> None:
    fake = fake_cluster()
    rec = WarmPoolReconciler(fake)
    rec.expectations.try_expect_creations("ns/pool", 3)
    rec.progress.set("ns/pool", True)
    rec.missing_templates.missing("ns/pool", "tmpl")
    assert await rec.reconcile(Request(NS, "pool")) == Result()
    assert rec.expectations.satisfied("ns/pool")
    assert not rec.progress.set("ns/pool", False)
    assert rec.missing_templates.found("ns/pool") is None


async def test_template_events_map_to_referencing_pools_only() -> None:
    fake = fake_cluster(
        (SANDBOX_WARM_POOL, pool(1, name="a", template_name="t1")),
        (SANDBOX_WARM_POOL, pool(1, name="b", template_name="t2")),
        (SANDBOX_WARM_POOL, pool(1, name="c", template_name="t1")),
    )
    async with running(fake) as h:
        mapper = pools_for_template(h.cache.informer(SANDBOX_WARM_POOL))
        assert sorted(r.name for r in mapper(template("t1"))) == ["a", "c"]
        assert [r.name for r in mapper(template("t2"))] == ["b"]
        other_ns = template("t1")
        other_ns["metadata"]["namespace"] = "elsewhere"
        assert mapper(other_ns) == []
        assert h.cache.informer(SANDBOX_WARM_POOL).by_index(INDEX_POOL_TEMPLATE_REF, "t1", NS)


async def test_cached_pod_read_errors_do_not_break_the_pass() -> None:
    # Pod not in the cache (NotFound) for a stuck member: it is treated as schedulable and replaced.
    async with running(standard(1), WarmPoolConfig(readiness_grace_period=1, grace_jitter=0)) as h:
        await h.reconcile()
        await h.settle()
        h.now += 10
        await h.reconcile()
        assert h.sandboxes() == []
    with pytest.raises(NotFound):
        await FakeClient().get(POD, "nope", namespace=NS)


async def test_replenish_delay_and_refill_rate_compose() -> None:
    cfg = WarmPoolConfig(replenish_delay=5, max_refill_rate=1, grace_jitter=0)
    async with running(standard(3), cfg) as h:
        await h.reconcile()  # initial fill: never held; the bucket (capacity 1) grants one
        assert h.creates() == 1
        for _ in range(2):
            await h.settle()
            h.clock.advance(1.0)
            await h.reconcile()
        assert h.creates() == 3
        await h.settle()
        await h.reconcile()
        for sb in h.sandboxes()[:2]:  # two members are claimed
            await h.fake.patch(
                SANDBOX,
                sb["metadata"]["name"],
                {"metadata": {"ownerReferences": [], "labels": {c.LABEL_WARM_POOL_SANDBOX: None}}},
                namespace=NS,
            )
        await h.settle()
        assert (await h.reconcile()).requeue_after == pytest.approx(5)  # the delay defers the start ...
        assert h.creates() == 3
        h.clock.advance(5.5)
        await h.reconcile()
        assert h.creates() == 4  # ... and the rate shapes the flow: one token, not the whole deficit
        await h.settle()
        assert (await h.reconcile()).requeue_after == pytest.approx(1.0)  # until the next whole token
        h.clock.advance(1.0)
        await h.reconcile()
        assert h.creates() == 5


async def test_stuck_members_are_collected_while_refill_is_paced() -> None:
    cfg = WarmPoolConfig(max_refill_rate=0.1, readiness_grace_period=30, grace_jitter=0)
    async with running(standard(3), cfg) as h:
        await h.reconcile()
        assert h.creates() == 1  # capacity 1, then one token per 10 s
        await h.settle()
        h.now += 60  # the member never became Ready
        result = await h.reconcile()
        assert h.sandboxes() == []  # collected although no token is available
        assert result.requeue_after == pytest.approx(10)
        assert h.creates() == 1


async def test_adoption_is_optimistically_locked() -> None:
    orphan = member("o", owner_uid=None)
    fake = fake_cluster((SANDBOX_TEMPLATE, template()), (SANDBOX_WARM_POOL, pool(1)), (SANDBOX, orphan))
    stale = fake.objects(SANDBOX)[0]
    await fake.patch(SANDBOX, "o", {"metadata": {"labels": {"someone": "else"}}}, namespace=NS)
    rec = WarmPoolReconciler(StaleReader(fake, [stale]), config=WarmPoolConfig(grace_jitter=0))  # type: ignore[arg-type]
    with pytest.raises(Conflict):
        await rec.reconcile(Request(NS, "pool"))
    assert "ownerReferences" not in fake.objects(SANDBOX)[0]["metadata"]


async def test_claim_pressure_holds_refill_not_status_and_coalesces_passes() -> None:
    async with running(standard(4)) as h:
        await h.reconcile()
        await h.settle()
        for sb in h.sandboxes():
            await make_ready(h.fake, sb["metadata"]["name"])
        await h.settle()
        await h.reconcile()
        assert h.pool_status()["readyReplicas"] == 4
        mono = FakeClock()
        pressure = ClaimPressure(15.0, clock=mono.now)
        h.reconciler.claim_yield = ClaimYield(pressure)
        claimed = h.sandboxes()[0]["metadata"]["name"]
        await take_member(h, claimed)
        pressure.note_arrival()
        held = await h.reconcile()
        assert held.requeue_after == pytest.approx(15.0)
        assert h.creates() == 4  # no refill: 3 of 4 still Ready
        assert h.pool_status()["readyReplicas"] == 3  # the status shows the member gone at once
        mono.advance(0.1)
        pressure.note_arrival()
        actions = len(h.fake.actions)
        throttled = await h.reconcile()  # a member event right after a full pass: no pass at all
        assert throttled.requeue_after == pytest.approx(0.4)
        assert len(h.fake.actions) == actions
        mono.advance(2.0)  # the claims stopped (the calm listener re-enqueues the pool)
        await h.reconcile()
        assert h.creates() == 5
        assert h.pool_status()["replicas"] == 3  # observed before the refill member shows up
        assert h.pool_status()["readyReplicas"] == 3


async def test_a_lost_create_the_cache_already_showed_defers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The member's add event beat the lost answer: nothing is pending, so no lowering may be deferred
    (it would land on the next batch's record)."""
    monkeypatch.setattr(pool_execute, "AMBIGUOUS_CREATE_HOLD", 0.01)
    exp = Expectations()
    assert exp.try_expect_creations("ns/pool", 1)

    class ObservedThenLost:
        async def create(self, kind: Any, body: Any, *, namespace: str | None = None) -> Any:
            exp.creation_observed("ns/pool")
            raise TransportError("POST: connection reset")

    created, err = await pool_execute.create_members(ObservedThenLost(), exp, "ns/pool", NS, {}, 1)  # type: ignore[arg-type]
    assert (created, isinstance(err, TransportError)) == (0, True)
    assert exp.try_expect_creations("ns/pool", 2)
    await asyncio.sleep(0.05)
    assert exp.pending("ns/pool") == (2, frozenset())


async def test_a_member_create_the_api_server_refuses_is_a_warning_event() -> None:
    """warmpool-quirks.md #13: a refused member create (quota, admission) is a `FailedCreate` Warning on the pool.

    Upstream says it only in the controller log; `kubectl describe sandboxwarmpool` showed nothing.
    """
    quota = Forbidden(
        403,
        "Forbidden",
        'sandboxes.agents.x-k8s.io "pool-x" is forbidden: exceeded quota: q, requested: '
        "count/sandboxes.agents.x-k8s.io=1, used: count/sandboxes.agents.x-k8s.io=1, limited: "
        "count/sandboxes.agents.x-k8s.io=1",
    )
    async with running(standard(3)) as h:
        h.fake.inject_error("create", quota, kind=SANDBOX, times=2)
        with pytest.raises(Forbidden):
            await h.reconcile()
        assert h.events.events == [
            (
                "Warning",
                c.EVENT_FAILED_CREATE,
                "Creating",
                'failed to create sandbox: sandboxes.agents.x-k8s.io "pool-x" is forbidden: exceeded quota: '
                "q, requested: count/sandboxes.agents.x-k8s.io=1, used: count/sandboxes.agents.x-k8s.io=1, "
                "limited: count/sandboxes.agents.x-k8s.io=1",
            )
        ]
        # Each failed pass reports once (the broadcaster aggregates repeats into the event's series).
        with pytest.raises(Forbidden):
            await h.reconcile()
        assert [e[1] for e in h.events.events] == [c.EVENT_FAILED_CREATE] * 2
        # Creates succeed again: no further event.
        await h.reconcile()
        assert len(h.events.events) == 2
        assert len(h.fake.objects(SANDBOX)) == 3


async def test_member_creates_refused_in_a_terminating_namespace_are_no_event() -> None:
    from tests.unit.kube.test_namespace_terminating import terminating

    async with running(standard(3)) as h:
        h.fake.inject_error("create", terminating("", NS, "sandboxes.agents.x-k8s.io"), kind=SANDBOX)
        await h.reconcile()
        assert h.events.events == []
